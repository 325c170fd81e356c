"""`POST /v1/score` (batch scoring) and `POST /classify` (DisRM pass-through)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends
from fastapi.responses import JSONResponse

from grm_service.api.deps import gateway, pinned_replica
from grm_service.proxy import Gateway, forward, wrap
from grm_service.scoring.batch import score_batch
from grm_service.scoring.models import ScoreRequest, ScoreResponse
from grm_service.scoring.registry import lookup
from grm_service.scoring.send import make_send, pooling_body

router = APIRouter()

GatewayDep = Annotated[Gateway, Depends(gateway)]
PinDep = Annotated[str | None, Depends(pinned_replica)]


async def run_score(gw: Gateway, req: ScoreRequest) -> ScoreResponse:
    scorer = lookup(req.scorer, tuple(gw.settings.scorers))
    answer = await score_batch(req, scorer, make_send(gw), gw.settings.score_concurrency,
                               gw.identity.fingerprint_id)
    failed = answer.fingerprint.errors
    count = gw.metrics.score_items.labels
    count(req.scorer, "ok").inc(len(answer.results) - failed)
    count(req.scorer, "error").inc(failed)
    return answer


@router.post("/v1/score")
async def score(req: ScoreRequest, gw: GatewayDep) -> ScoreResponse:
    """Score a batch; results come back in input order, each with its fingerprint."""
    return await run_score(gw, req)


@router.post("/classify")
async def classify(
    body: Annotated[dict[str, Any], Body()], gw: GatewayDep, pin: PinDep
) -> JSONResponse:
    """vLLM's `/classify`, run alone on its replica, answered with `grm_fingerprint`."""
    prepared = pooling_body(body, gw.settings.model_name)
    forwarded = await forward(gw, "/classify", prepared, pin)
    return JSONResponse(wrap(forwarded), headers=forwarded.fingerprint.headers())
