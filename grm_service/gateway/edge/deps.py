"""Request-scoped access to the objects the composition root (gateway/service.py) holds."""

from __future__ import annotations

from typing import cast

from fastapi import Request

from grm_service.errors import ServiceUnavailable
from grm_service.gateway.edge.guards import presented_key
from grm_service.gateway.request.proxy import Gateway
from grm_service.gateway.service import Service
from grm_service.headers import PIN_HEADER, RUN_HEADER, STEP_HEADER
from grm_service.ledger.records import Origin
from grm_service.scoring.groups.held import HeldGroups


# async on purpose: FastAPI runs a plain `def` dependency in its thread pool, a thread hop
# (and GIL handoff) per request for what is an attribute read.
async def gateway(request: Request) -> Gateway:
    service = cast(Service, request.app.state.service)
    gw = service.gateway
    if gw is None:
        raise service.refusals.refuse("starting", ServiceUnavailable(
            "the gateway is starting (its replicas are not looked at yet): retry in a "
            "second; GET /ready says when it serves", retry_after=1))
    return gw


async def held_groups(request: Request) -> HeldGroups:
    """The process's held groups (`seam.Holder`): items of one group sent in several requests."""
    return cast(Service, request.app.state.service).held


async def pinned_replica(request: Request) -> str | None:
    """Routing override for checks that must reach one replica (e.g. `verify`); a repeated
    header never reaches a route (`Guards`)."""
    return request.headers.get(PIN_HEADER)


async def origin(request: Request) -> Origin:
    """Who asks (the API key's id) and the client's run and step tags, for the ledger."""
    headers = request.headers
    token = presented_key(headers.get("authorization", "").encode("latin-1"))
    return Origin.of(request.url.path, token, headers.get(RUN_HEADER), headers.get(STEP_HEADER))
