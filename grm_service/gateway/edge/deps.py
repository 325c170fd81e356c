"""Request-scoped access to the objects the composition root (gateway/service.py) holds."""

from __future__ import annotations

from typing import cast

from fastapi import Request
from starlette.responses import Response

from grm_service.gateway.edge.guards import HEAD, asker_of
from grm_service.gateway.edge.hotpath import HotPath, starting
from grm_service.gateway.edge.replies import ReplyResponse
from grm_service.gateway.request.context import ForwardContext
from grm_service.gateway.service import Service
from grm_service.headers import PIN_HEADER, RUN_HEADER, STEP_HEADER
from grm_service.ledger.records import Origin
from grm_service.scoring.groups.held import HeldGroups


# async on purpose: FastAPI runs a plain `def` dependency in its thread pool, a thread hop
# (and GIL handoff) per request for what is an attribute read.
async def gateway(request: Request) -> ForwardContext:
    service = cast(Service, request.app.state.service)
    gw = service.gateway
    if gw is None:
        raise service.refusals.refuse("starting", starting())
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
    return Origin.of(request.url.path, asker_of(request.scope).key, headers.get(RUN_HEADER),
                     headers.get(STEP_HEADER))


async def hot_door(request: Request, path: str) -> Response:
    """A hot route reached through FastAPI, answered by the hot path's `serve` (the one door),
    with the head admitted in front of the app."""
    hot = cast(HotPath, request.app.state.hot)
    return ReplyResponse(await hot.serve(path, request.scope[HEAD], await request.body()))
