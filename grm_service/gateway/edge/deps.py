"""Request-scoped access to the objects the lifespan built."""

from __future__ import annotations

from typing import cast

from fastapi import Request

from grm_service.gateway.request.proxy import Gateway
from grm_service.headers import PIN_HEADER


# async on purpose: FastAPI runs a plain `def` dependency in its thread pool, a thread hop
# (and GIL handoff) per request for what is an attribute read.
async def gateway(request: Request) -> Gateway:
    return cast(Gateway, request.app.state.gateway)


async def pinned_replica(request: Request) -> str | None:
    """Routing override for checks that must reach one replica (e.g. `verify`)."""
    return request.headers.get(PIN_HEADER)
