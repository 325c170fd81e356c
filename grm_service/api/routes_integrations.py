"""Trainer-facing endpoints: OpenRLHF's remote reward protocol on top of the batch scorer."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from grm_service.api.deps import gateway
from grm_service.api.routes_score import run_score
from grm_service.errors import BackendFailed, InvalidRequest
from grm_service.integrations.common import ScoringError
from grm_service.integrations.openrlhf import RewardRequest, to_items, to_response
from grm_service.proxy import Gateway
from grm_service.scoring.models import ScoreRequest

router = APIRouter()
GatewayDep = Annotated[Gateway, Depends(gateway)]


@router.post("/openrlhf/reward")
async def openrlhf_reward(
    req: RewardRequest, gw: GatewayDep,
    scorer: Annotated[str, Query(description="Registered scorer to use.")] = "judge",
    error_reward: Annotated[
        float | None, Query(description="Reward of a failed item; unset: the call fails.")
    ] = None,
) -> dict[str, Any]:
    """`--remote_rm_url` (`--reward.remote_url`) points here: `.../openrlhf/reward?scorer=judge`."""
    try:
        # pydantic's ValidationError is a ValueError: an empty scorer or no items is a 400.
        request = ScoreRequest(scorer=scorer, items=to_items(req))
    except ValueError as err:
        raise InvalidRequest(str(err)) from None
    answer = await run_score(gw, request)
    try:
        return to_response(answer.results, error_reward)
    except ScoringError as err:
        raise BackendFailed(str(err)) from None
