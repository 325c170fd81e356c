"""`GET /v1/ledger/...`: the ledger read back, behind the key; a key sees its own records."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BeforeValidator

from grm_service.digits import is_decimal
from grm_service.errors import InvalidRequest, NotFound
from grm_service.gateway.edge.deps import gateway
from grm_service.gateway.edge.guards import asker_of
from grm_service.gateway.request.context import ForwardContext
from grm_service.ledger.book import Ledger
from grm_service.ledger.query import PAGE, detail, export_rows, parse_steps, summary
from grm_service.ledger.records import Record, key_id
from grm_service.ledger.store import Selection, Store

router = APIRouter(prefix="/v1/ledger")
GatewayDep = Annotated[ForwardContext, Depends(gateway)]
Run = Annotated[str | None, Query(description="Run tag; empty: untagged requests.")]
Steps = Annotated[str | None, Query(description="Steps a:b (both included), a:, :b or a.")]
# What a store's 64-bit integer columns hold.
_INT64 = 2**63 - 1


def _ascii_digits(value: object) -> object:
    """pydantic reads ' 1', '+1', '1_000' and '1.0' as 1: an id or a count is ASCII digits."""
    if isinstance(value, str) and not is_decimal(value):
        raise ValueError("expected an integer in ASCII digits (0-9)")
    return value


Digits = BeforeValidator(_ascii_digits)


def _ledger(gw: ForwardContext) -> Ledger:
    if gw.ledger is None:
        raise NotFound("the ledger is off here (GRM_LEDGER=false)")
    return gw.ledger


def _key(request: Request, gw: ForwardContext) -> str | None:
    """The caller's key id; None (every record) where the service has no keys."""
    if not gw.settings.api_keys and gw.settings.api_keys_file is None:
        return None
    return key_id(asker_of(request.scope).key)


def _selection(request: Request, gw: ForwardContext, run: str | None, steps: str | None,
               request_digest: str | None = None) -> Selection:
    try:
        first, last = parse_steps(steps)
    except ValueError as err:
        raise InvalidRequest(str(err)) from None
    return Selection(_key(request, gw), run, first, last, request_digest)


@router.get("/runs")
async def runs(request: Request, gw: GatewayDep) -> dict[str, Any]:
    key = _key(request, gw)
    return {"runs": await _ledger(gw).read(lambda store: store.runs(key))}


@router.get("/steps")
async def steps(request: Request, gw: GatewayDep, run: Annotated[str, Query()]) -> dict[str, Any]:
    key = _key(request, gw)
    return {"run": run, "steps": await _ledger(gw).read(lambda store: store.steps(run, key))}


@router.get("/records")
async def records(
    request: Request, gw: GatewayDep, run: Run = None, steps: Steps = None,
    request_digest: Annotated[str | None, Query()] = None,
    after: Annotated[int, Digits,
                     Query(ge=0, le=_INT64, description="Records after this id.")] = 0,
    limit: Annotated[int, Digits, Query(ge=1, le=PAGE)] = 100,
) -> dict[str, Any]:
    selection = _selection(request, gw, run, steps, request_digest)
    found = await _ledger(gw).read(lambda store: store.records(selection, limit, after))
    return {"records": [summary(r) for r in found]}


@router.get("/records/{record_id}")
async def record(request: Request, gw: GatewayDep,
                 record_id: Annotated[int, Digits, Path(ge=0, le=_INT64)]) -> dict[str, Any]:
    key = _key(request, gw)
    found = await _ledger(gw).read(lambda store: store.record(record_id, key))
    if found is None:
        raise NotFound(f"no ledger record {record_id} for this key")
    return detail(found)


@router.get("/export")
async def export(request: Request, gw: GatewayDep, run: Run = None,
                 steps: Steps = None) -> StreamingResponse:
    """JSONL that `grm-service diff` reads, a page of records at a time."""
    selection, ledger = _selection(request, gw, run, steps), _ledger(gw)

    async def lines() -> AsyncIterator[bytes]:
        after, seen = 0, dict[str, int]()
        while True:
            page = await ledger.read(partial(_page, selection=selection, after=after))
            for row in export_rows(page, seen):
                yield (json.dumps(row) + "\n").encode()
            if len(page) < PAGE:
                return
            after = page[-1].id or after

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def _page(store: Store, selection: Selection, after: int) -> list[Record]:
    return store.records(selection, PAGE, after)
