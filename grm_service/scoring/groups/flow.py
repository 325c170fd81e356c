"""A group scorer's request: its items partitioned into groups, each judged whole.

Items with the same `group_id` form a group; the items without one are together one group of
this request (one call, one group: TRL's case). A group is complete when it has no `group_size`
or as many items here as its `group_size`: it is judged now. An incomplete one goes to the
`Holder`, where the service has one, which waits for its other items from other requests;
without one, each of its items gets an error that says how to send the group.

Results come back in input order, each item's reward mapped back by its id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grm_service.errors import InvalidRequest
from grm_service.fingerprint import json_digest
from grm_service.scoring.batch import combine, item_digest, with_data_urls
from grm_service.scoring.context import ItemError, Send
from grm_service.scoring.groups.canon import candidates, group_digest
from grm_service.scoring.groups.scorer import GroupContext, GroupScorer, Outcome, Task
from grm_service.scoring.groups.seam import Holder, Judge
from grm_service.scoring.models import (
    BatchFingerprint,
    ItemResult,
    ScoreItem,
    ScoreRequest,
    ScoreResponse,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Groups:
    """What one request's groups need besides the request: where to send, how many judge
    requests at once, the seed comparison seeds derive from, the holder (or None), the asker's
    key scope, the bound on a group's size (GRM_GROUP_MAX_SIZE), and how a held group's
    judging is counted as owed service while it runs (`Backlog.owe`: its items did not owe
    while they waited, else a trainer's waiting samples would fill the backlog and refuse the
    very samples that complete their groups)."""

    send: Send
    concurrency: int
    service_seed: int
    holder: Holder | None = None
    scope: str = ""
    max_size: int = 64
    owing: Callable[[int], contextlib.AbstractContextManager[Any]] | None = None


def partition(items: list[ScoreItem]) -> dict[str | None, list[ScoreItem]]:
    """Items by `group_id` (None: the items without one), in order of first appearance."""
    groups: dict[str | None, list[ScoreItem]] = {}
    for item in items:
        groups.setdefault(item.group_id, []).append(item)
    return groups


def group_size(group_id: str | None, members: list[ScoreItem], max_size: int) -> int:
    """The size the group declares (or has here); InvalidRequest (400) when its items disagree,
    it has more items here than it declares, or it is larger than `max_size`."""
    name = "the items without group_id" if group_id is None else f"group {group_id!r:.80}"
    sizes = {m.group_size for m in members if m.group_size is not None}
    if len(sizes) > 1:
        raise InvalidRequest(f"{name} has items of different group_size ({sorted(sizes)}); "
                             "give each item of a group the same group_size")
    size = sizes.pop() if sizes else len(members)
    if size < len(members):
        raise InvalidRequest(f"{name} has {len(members)} items here but group_size {size}; "
                             "give the group's true size")
    if group_id is None and size > len(members):
        raise InvalidRequest(f"{name} are one group of this request, yet declare group_size "
                             f"{size} with {len(members)} here: give them a group_id to send "
                             "a group over several requests")
    if size > max_size:
        raise InvalidRequest(f"{name} has {size} items; the limit is {max_size} "
                             "(GRM_GROUP_MAX_SIZE): judge smaller groups")
    return size


def check_groups(items: list[ScoreItem], max_size: int) -> None:
    """Every group's size is consistent and bounded (400 before any item runs)."""
    for group_id, members in partition(items).items():
        group_size(group_id, members, max_size)


def base_seed(req: ScoreRequest, service_seed: int) -> int:
    seed = req.sampling.get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else service_seed


def error_result(item_id: str, error: str) -> ItemResult:
    return ItemResult(id=item_id, score=None, status="error", error=error,
                      digest=item_digest(item_id, None, None))


def result(item_id: str, out: Outcome) -> ItemResult:
    fp = combine(out.fingerprints)
    response: list[str] | None = list(out.responses) if out.responses else None
    if out.error is not None or out.score is None:
        return ItemResult(id=item_id, score=None, status="error", error=out.error,
                          response=response, fingerprint=fp,
                          digest=item_digest(item_id, None, fp))
    return ItemResult(id=item_id, score=out.score, status="ok", response=response,
                      fingerprint=fp, digest=item_digest(item_id, out.score, fp))


class GroupJudge:
    """Judges one complete group (its members in any order): the `seam.Judge` of a group."""

    def __init__(self, scorer: GroupScorer, ctx: GroupContext) -> None:
        self.scorer, self.ctx = scorer, ctx

    async def __call__(self, members: list[ScoreItem]) -> dict[str, ItemResult]:
        results: dict[str, ItemResult] = {}
        ready: list[ScoreItem] = []
        for item in members:
            try:
                ready.append(with_data_urls(item))
            except ItemError as err:
                results[item.id] = error_result(item.id, str(err))
        tasks = {(i.prompt or "", i.reference or "") for i in ready}
        if len(tasks) > 1:
            error = ("the items of this group have different prompts or references; a group "
                     "is the completions of one prompt")
            results.update({i.id: error_result(i.id, error) for i in ready})
            return results
        if ready:
            prompt, reference = tasks.pop()
            cands = candidates(ready)
            outcomes = await self.scorer.judge(cands, Task(prompt, reference), self.ctx)
            for cand, out in zip(cands, outcomes, strict=True):
                results.update({i: result(i, out) for i in cand.ids})
        return results


def owed(judge: Judge, owing: Callable[[int], contextlib.AbstractContextManager[Any]] | None
         ) -> Judge:
    """`judge`, its group counted as owed service while it is judged."""
    if owing is None:
        return judge

    async def judged(members: list[ScoreItem]) -> dict[str, ItemResult]:
        with owing(len(members)):
            return await judge(members)

    return judged


def complete_items(items: list[ScoreItem], max_size: int) -> int:
    """How many of `items` are in groups complete in this request (judged now)."""
    return sum(len(members) for group_id, members in partition(items).items()
               if group_size(group_id, members, max_size) == len(members))


def incomplete(group_id: str | None, have: int, size: int) -> str:
    name = "the items without group_id" if group_id is None else f"group {group_id!r:.80}"
    return (f"{name} has {have} of its {size} items in this request, and this service does not "
            "hold groups: send all of a group's items in one request")


async def score_groups(req: ScoreRequest, scorer: GroupScorer, groups: Groups,
                       fingerprint_id: str, timed: Callable[[float], None] | None = None
                       ) -> ScoreResponse:
    """The results of every group of `req`, in input order. `timed`, when given, is called
    for each item with its group's scoring time in seconds."""
    ctx = GroupContext(send=groups.send, sampling=req.sampling, options=req.options,
                       base_seed=base_seed(req, groups.service_seed),
                       limit=asyncio.Semaphore(groups.concurrency))
    found: dict[str, ItemResult] = {}

    async def one(group_id: str | None, members: list[ScoreItem]) -> None:
        started = time.perf_counter()
        size = group_size(group_id, members, groups.max_size)
        judge = GroupJudge(scorer, ctx)
        if size == len(members):
            found.update(await judge(members))
        elif groups.holder is not None:
            digest = group_digest(groups.scope, req.scorer, req.options, req.sampling, group_id)
            found.update(await groups.holder.score_held(digest, size, members,
                                                        owed(judge, groups.owing)))
        else:
            found.update({m.id: error_result(m.id, incomplete(group_id, len(members), size))
                          for m in members})
        if timed is not None:
            for _ in members:
                timed(time.perf_counter() - started)

    try:
        async with asyncio.TaskGroup() as tasks:
            for group_id, members in partition(req.items).items():
                tasks.create_task(one(group_id, members))
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    results = [found.get(i.id) or error_result(i.id, "the group gave no result for this item")
               for i in req.items]
    errors = sum(r.status == "error" for r in results)
    if errors:
        log.info("scored %d items with %s: %d errors", len(results), req.scorer, errors)
    batch = BatchFingerprint(fingerprint_id=fingerprint_id, scorer=req.scorer,
                             items=len(results), errors=errors,
                             digest=json_digest([r.digest for r in results]))
    return ScoreResponse(results=results, fingerprint=batch)
