"""`POST /v1/score` (batch scoring) and `POST /classify` (DisRM pass-through)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from grm_service.errors import TooLarge
from grm_service.gateway.edge.deps import gateway, held_groups, hot_door, origin
from grm_service.gateway.edge.hotpath import CLASSIFY
from grm_service.gateway.edge.schemas import ClassifyRequest, body_schema
from grm_service.gateway.edge.score_body import read_score_request
from grm_service.gateway.request import checkpoint
from grm_service.gateway.request.context import ForwardContext
from grm_service.gateway.request.send import make_send
from grm_service.ledger.records import Origin
from grm_service.scoring import presets
from grm_service.scoring.batch import score_batch
from grm_service.scoring.groups.flow import Groups, check_groups, complete_items, score_groups
from grm_service.scoring.groups.held import HeldGroups
from grm_service.scoring.groups.scorer import GroupScorer
from grm_service.scoring.groups.seam import Holder
from grm_service.scoring.models import ScoreRequest, ScoreResponse
from grm_service.scoring.registry import check_request, finish_of, lookup

router = APIRouter()

GatewayDep = Annotated[ForwardContext, Depends(gateway)]
OriginDep = Annotated[Origin, Depends(origin)]
HeldDep = Annotated[HeldGroups, Depends(held_groups)]


async def run_score(gw: ForwardContext, req: ScoreRequest, asker: Origin | None = None,
                    holder: Holder | None = None) -> ScoreResponse:
    """Request-level checks (400/413 before any item runs), then the batch. A group scorer's
    incomplete groups go to `holder` (None: they are their items' errors); pointwise scorers
    ignore `group_id` and `group_size`."""
    cap = gw.settings.max_score_items
    if len(req.items) > cap:
        raise TooLarge(f"{len(req.items)} items in one batch; the limit is {cap} "
                       "(GRM_MAX_SCORE_ITEMS): split the batch")
    # A preset is a scorer name: its options and sampling go under the request's own.
    name, req = presets.resolve(req, presets.load(gw.settings.scorer_presets))
    scorer = lookup(name, tuple(gw.settings.scorers))
    checkpoint.check_sampling(req.sampling, gw.limits)
    checkpoint.check_shared_size("options", req.options)
    check_request(name, scorer, req)
    if isinstance(scorer, GroupScorer):
        check_groups(req.items, gw.settings.group_max_size)
    observe = gw.metrics.score_item_latency.labels(req.scorer).observe
    # Items that wait for their group's other items owe nothing while they wait (bounded by
    # GRM_GROUP_MAX_OPEN instead); their group owes while it is judged (`Groups.owing`).
    owes = complete_items(req.items, gw.settings.group_max_size) if isinstance(
        scorer, GroupScorer) else len(req.items)
    with gw.owe(owes) as debt:  # admitted, or 429 before any item runs

        def timed(seconds: float) -> None:
            observe(seconds)
            debt.settle()

        send = make_send(gw, asker, _max_tokens(gw, req))
        if isinstance(scorer, GroupScorer):
            groups = Groups(send=send, concurrency=gw.settings.score_concurrency,
                            service_seed=gw.request_settings.seed, holder=holder,
                            scope=asker.key_id if asker else "",
                            max_size=gw.settings.group_max_size, owing=gw.backlog.owe)
            answer = await score_groups(req, scorer, groups, gw.identity.fingerprint_id, timed)
        else:
            answer = await score_batch(req, scorer, send, gw.settings.score_concurrency,
                                       gw.identity.fingerprint_id, timed, gw.scales,
                                       finish_of(name, scorer))
    failed = answer.fingerprint.errors
    count = gw.metrics.score_items.labels
    count(req.scorer, "ok").inc(len(answer.results) - failed)
    count(req.scorer, "error").inc(failed)
    return answer


def _max_tokens(gw: ForwardContext, req: ScoreRequest) -> int | None:
    """The cap of the scorer's max_tokens: none where the batch's sampling sets its own."""
    if "max_tokens" in req.sampling or "max_completion_tokens" in req.sampling:
        return None
    return gw.identity.score_max_tokens


@router.post("/v1/score", response_model=ScoreResponse)
async def score(request: Request, gw: GatewayDep, asker: OriginDep, held: HeldDep) -> Response:
    """Score a batch; results come back in input order, each with its fingerprint.

    The body is a `ScoreRequest` (schema: `score_body.add_score_schema`), read in chunks."""
    with gw.batch():  # from before its body is read: a batch begun before a stop finishes
        req = await read_score_request(request, gw.settings.max_score_items)
        answer = await run_score(gw, req, asker, held)
    # pydantic-core serializes in one pass; FastAPI's response_model path would validate and
    # encode every result again (seconds, on the event loop, for a batch of thousands).
    return Response(answer.model_dump_json(), media_type="application/json")


@router.post(CLASSIFY, openapi_extra=body_schema(ClassifyRequest))
async def classify(request: Request) -> Response:
    """vLLM's `/classify`, run alone on its replica, answered with `grm_fingerprint` by the hot
    path's one door (`HotPath.serve`)."""
    return await hot_door(request, CLASSIFY)
