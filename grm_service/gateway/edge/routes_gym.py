"""NeMo Gym's resources-server contract: `POST /verify` (and `/seed_session`, which Gym's
agents call first, and `/aggregate_metrics`, which its rollout collection calls last), scored
by the `/v1/score` machinery (`routes_score.run_score`).

The reward comes from the scorer the server's configuration names (`GRM_VERIFY_SCORER`: a scorer
or a preset), on the item `scoring/gym.py` reads out of Gym's request. The answer is Gym's
`BaseVerifyResponse`: the request as sent, plus `reward`, plus `grm_fingerprint` (the item's
fingerprint, as on `/v1/score`) and the fingerprint headers of the other routes. An item the
scorer could not score is a 502 that says why, never a reward of 0.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from grm_service.config import Settings
from grm_service.errors import ConfigError, NoReward
from grm_service.gateway.edge.deps import gateway, held_groups, origin
from grm_service.gateway.edge.routes_score import run_score
from grm_service.gateway.request.answer import RESPONSE_JSON
from grm_service.gateway.request.context import ForwardContext
from grm_service.ledger.book import SCORE_ROUTE
from grm_service.ledger.records import Origin
from grm_service.scoring import gym, gym_metrics
from grm_service.scoring.groups.held import HeldGroups
from grm_service.scoring.models import ItemResult, ScoreRequest

router = APIRouter()

GatewayDep = Annotated[ForwardContext, Depends(gateway)]
OriginDep = Annotated[Origin, Depends(origin)]
HeldDep = Annotated[HeldGroups, Depends(held_groups)]


class VerifyRequest(BaseModel):
    """NeMo Gym's `BaseVerifyRequest`; the dataset row's other fields are kept and sent back."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: dict[str, Any]
    response: dict[str, Any]


class AggregateMetricsRequest(BaseModel):
    """Gym's `AggregateMetricsRequest`: the verify responses of a rollout collection."""

    verify_responses: list[dict[str, Any]]


def check_scorer(settings: Settings, names: list[str]) -> list[str]:
    """`names` (every scorer and preset), once GRM_VERIFY_SCORER is found among them; a
    setting that names none fails start-up instead of every /verify."""
    if settings.verify_scorer not in names:
        raise ConfigError(f"GRM_VERIFY_SCORER={settings.verify_scorer!r} names no scorer or "
                          f"preset; known: {', '.join(names)}")
    return names


@router.post("/aggregate_metrics")
async def aggregate_metrics(body: AggregateMetricsRequest) -> dict[str, Any]:
    """The rewards of the collection's verify responses, per task and over all."""
    return gym_metrics.aggregate(body.verify_responses)


@router.post("/seed_session")
async def seed_session() -> dict[str, Any]:
    """Gym's agents open every rollout here; a reward model keeps no session state."""
    return {}


@router.post("/verify")
async def verify(body: VerifyRequest, gw: GatewayDep, asker: OriginDep,
                 held: HeldDep) -> Response:
    """The request back with its `reward` and the fingerprint of the judgment."""
    sent = body.model_dump(mode="json")
    settings = gw.settings
    item = gym.item_of(sent, settings.verify_reference_field, settings.verify_group_size)
    # On the ledger as a score item, as the trainers' routes are (`routes_integrations`).
    scored = Origin(SCORE_ROUTE, asker.key_id, asker.run, asker.step)
    with gw.batch():
        answer = await run_score(gw, ScoreRequest(scorer=settings.verify_scorer, items=[item]),
                                 scored, held)
    result = answer.results[0]
    return Response(RESPONSE_JSON.encode(rewarded(sent, result)), media_type="application/json",
                    headers=result.fingerprint.headers() if result.fingerprint else None)


def rewarded(sent: dict[str, Any], result: ItemResult) -> dict[str, Any]:
    """Gym's `BaseVerifyResponse` of `sent`; NoReward where the item failed."""
    if result.status != "ok" or result.score is None:
        raise NoReward(f"no reward for this rollout: {result.error}")
    fingerprint = result.fingerprint.model_dump(mode="json") if result.fingerprint else None
    return {**sent, "reward": result.score, "grm_fingerprint": fingerprint,
            "grm_digest": result.digest}
