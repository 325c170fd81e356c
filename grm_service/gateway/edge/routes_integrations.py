"""Trainer-facing endpoints: OpenRLHF's remote reward protocol on top of the batch scorer."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from grm_service.errors import InvalidRequest
from grm_service.gateway.edge.deps import gateway, origin
from grm_service.gateway.edge.routes_score import run_score
from grm_service.gateway.request.context import ForwardContext
from grm_service.integrations.openrlhf import (
    AUTO,
    DEFAULT_ERROR_REWARD,
    RewardRequest,
    cut_by_openrlhf,
    to_items,
    to_response,
)
from grm_service.ledger.book import SCORE_ROUTE
from grm_service.ledger.records import Origin
from grm_service.scoring.models import ScoreRequest
from grm_service.wire import ItemResult

router = APIRouter()
GatewayDep = Annotated[ForwardContext, Depends(gateway)]
OriginDep = Annotated[Origin, Depends(origin)]


class RewardBody(BaseModel):
    """The schema of OpenRLHF's body (`openrlhf.RewardRequest`); other fields it sends are
    ignored."""

    model_config = ConfigDict(extra="allow")

    query: list[str] = Field(min_length=1)
    prompts: list[str] | None = None
    labels: list[Any] | None = None


@router.post("/openrlhf/reward")
async def openrlhf_reward(
    req: RewardBody, gw: GatewayDep, http: Request, asker: OriginDep,
    scorer: Annotated[str, Query(description="Registered scorer to use.")] = "judge",
    error_reward: Annotated[
        float, Query(description="Reward of a failed item (flagged in extra_logs.grm_error).",
                     allow_inf_nan=False)
    ] = DEFAULT_ERROR_REWARD,
    special_tokens: Annotated[list[str], Query(
        description="Stripped from query and prompts: auto (common chat-template tokens), "
                    "keep, or a list separated by spaces ('+'), or the parameter repeated; "
                    "never by commas (OpenRLHF splits its URL on them).")] = [AUTO],  # noqa: B006
) -> dict[str, Any]:
    """`--reward.remote_url` points here: `.../openrlhf/reward?scorer=judge`. A failed item is
    `error_reward` with `extra_logs.grm_error` = 1, never a failed call: OpenRLHF would retry
    the whole batch, then drop its rewards."""
    cut = cut_by_openrlhf(http.url.query)
    if cut:
        raise InvalidRequest(cut)
    try:
        # pydantic's ValidationError is a ValueError: an empty scorer or no items is a 400.
        asked = RewardRequest(query=req.query, prompts=req.prompts, labels=req.labels)
        items = [item.to_json() for item in to_items(asked, special_tokens)]
        request = ScoreRequest.model_validate({"scorer": scorer, "items": items})
    except ValueError as err:
        raise InvalidRequest(str(err)) from None
    # The trainer's tags come as headers (x-grm-run, x-grm-step), where its client sends them.
    with gw.batch():
        answer = await run_score(gw, request, Origin(SCORE_ROUTE, asker.key_id, asker.run,
                                                     asker.step))
    results = [ItemResult.from_json(r.model_dump(mode="json")) for r in answer.results]
    return to_response(results, error_reward)
