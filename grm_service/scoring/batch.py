"""The batch flow of `POST /v1/score`: every item scored concurrently, results in input order.

An item fails alone (bad image, engine refusal, unparsable answer): it comes back with
`status: error` and a message, never as a silent 0. Only "the service cannot take work now"
(503/429) fails the whole batch, so that clients retry it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from grm_service.dual_scales import DualScales
from grm_service.fingerprint import Fingerprint, json_digest
from grm_service.scoring.context import (
    ITEM_FAILURES,
    Finish,
    ItemError,
    Scorer,
    ScorerContext,
    Send,
)
from grm_service.scoring.images import to_data_url
from grm_service.scoring.models import (
    BatchFingerprint,
    ItemResult,
    ScoreItem,
    ScoreRequest,
    ScoreResponse,
)

log = logging.getLogger(__name__)

def with_data_urls(item: ScoreItem) -> ScoreItem:
    """The item with every image as a data URL (checked by the checkpoint when sent)."""
    frames = item.frames()
    if not frames:
        return item
    urls = [to_data_url(f) for f in frames]
    image: str | list[str] = urls[0] if isinstance(item.image, str) else urls
    return item.model_copy(update={"image": image})


def combine(fingerprints: list[Fingerprint]) -> Fingerprint | None:
    """One fingerprint for an item that took several requests (video frames)."""
    if len(fingerprints) <= 1:
        return fingerprints[0] if fingerprints else None
    return fingerprints[0].model_copy(update={
        "replica": ",".join(sorted({f.replica for f in fingerprints})),
        "serialized": any(f.serialized for f in fingerprints),
        "request_digest": json_digest([f.request_digest for f in fingerprints]),
        "response_digest": json_digest([f.response_digest for f in fingerprints]),
    })


def item_digest(item_id: str, score: float | None, fp: Fingerprint | None) -> str:
    return json_digest({
        "id": item_id, "score": score,
        "request_digest": fp.request_digest if fp else None,
        "response_digest": fp.response_digest if fp else None,
    })


def _response(ctx: ScorerContext, item: ScoreItem) -> str | list[str] | None:
    if not ctx.responses:
        return None
    return ctx.responses if isinstance(item.image, list) else ctx.responses[0]


async def score_item(item: ScoreItem, scorer: Scorer, send: Send, req: ScoreRequest,
                     scales: DualScales | None = None) -> ItemResult:
    ctx = ScorerContext(send=send, sampling=req.sampling, options=req.options, scales=scales)
    try:
        value = await scorer(with_data_urls(item), ctx)
        if not math.isfinite(value):
            raise ItemError(f"score {value} is not a finite number")
    except ITEM_FAILURES as err:
        fp = combine(ctx.fingerprints)
        return ItemResult(id=item.id, score=None, status="error", error=str(err),
                          response=_response(ctx, item), fingerprint=fp,
                          digest=item_digest(item.id, None, fp))
    fp = combine(ctx.fingerprints)
    return ItemResult(id=item.id, score=value, status="ok", response=_response(ctx, item),
                      fingerprint=fp, digest=item_digest(item.id, value, fp))


def _redigested(result: ItemResult) -> ItemResult:
    """A result whose score `finish` changed, its digest made again over the new score."""
    digest = item_digest(result.id, result.score, result.fingerprint)
    return result if digest == result.digest else result.model_copy(update={"digest": digest})


async def score_batch(
    req: ScoreRequest, scorer: Scorer, send: Send, concurrency: int, fingerprint_id: str,
    timed: Callable[[float], None] | None = None, scales: DualScales | None = None,
    finish: Finish | None = None,
) -> ScoreResponse:
    """`timed`, when given, is called with each item's scoring time in seconds; `scales`: the
    served dual encoder's (`ScorerContext.scales`); `finish`: the scorer's step over the whole
    batch's results (a group softmax), before the batch digest."""
    slots: list[ItemResult | None] = [None] * len(req.items)
    todo = iter(enumerate(req.items))

    async def worker() -> None:
        # `concurrency` workers share one iterator, instead of a task per item: a task per item
        # of a 100,000-item batch is 100,000 tasks made ready at once, run in one loop turn.
        for index, item in todo:
            started = time.perf_counter()
            slots[index] = await score_item(item, scorer, send, req, scales)
            if timed is not None:
                timed(time.perf_counter() - started)
            # One item per turn, so that items that fail at once (no await that suspends)
            # still leave the loop to other requests between them.
            await asyncio.sleep(0)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(concurrency, len(req.items))):
                group.create_task(worker())
    except BaseExceptionGroup as failed:
        # The batch fails as a whole (e.g. 503): raise the first cause so it maps to HTTP.
        raise failed.exceptions[0] from None
    results = [r for r in slots if r is not None]
    if finish is not None:
        results = [_redigested(r) for r in finish(req.items, results, req.options)]
    errors = sum(r.status == "error" for r in results)
    if errors:
        log.info("scored %d items with %s: %d errors", len(results), req.scorer, errors)
    batch = BatchFingerprint(
        fingerprint_id=fingerprint_id, scorer=req.scorer, items=len(results), errors=errors,
        digest=json_digest([r.digest for r in results]),
    )
    return ScoreResponse(results=results, fingerprint=batch)
