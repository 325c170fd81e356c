"""Groups whose items come in several requests: held in a file until complete, judged once.

A trainer that scores one sample per call (verl) sends each item with `group_id` and
`group_size`. Its calls land on any worker of the service (`serve --workers N`), at any time.
Each call's items join the group in the service's `groups.sqlite` (store.py), shared by every
worker and kept across restarts, and its request waits. When the group has all its items, ONE
waiter, in whichever process, claims it (an atomic update, under a lease it renews while it
judges), judges the complete group and writes the results; every waiter reads them. A claimer
that dies stops renewing: when its lease runs out, another waiter takes the claim over.

Waiting costs no memory per item: the items are in the file. A process keeps one event per group
it has waiters of; its own writes set them at once, and one task looks every GRM_GROUP_POLL_S
for other processes' writes (`PRAGMA data_version`, then the groups written since). Every wait is
bounded: a group not complete GRM_GROUP_TIMEOUT_S after its first item gives each waiting item an
error that names it and how many of its items came; a new group past GRM_GROUP_MAX_OPEN is
refused (`TooManyGroups`, 429 with Retry-After).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from grm_service.canonical import canonical_json
from grm_service.config import Settings
from grm_service.errors import GrmError
from grm_service.fingerprint import json_digest
from grm_service.scoring.batch import item_digest
from grm_service.scoring.groups.seam import Judge
from grm_service.scoring.groups.store import Bounds, GroupStore, Member, State, View
from grm_service.scoring.models import ItemResult, ScoreItem

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# How often stale groups are dropped from the file (any worker may; each drop is one statement).
_PRUNE_EVERY_S = 30.0


@dataclass(frozen=True)
class HoldSettings:
    path: Path
    timeout_s: float
    max_open: int
    lease_s: float
    poll_s: float
    keep_s: float

    @classmethod
    def of(cls, settings: Settings) -> HoldSettings:
        return cls(settings.groups_location, settings.group_timeout_s, settings.group_max_open,
                   settings.group_lease_s, settings.group_poll_s, settings.group_keep_s)


def error_result(item_id: str, message: str) -> ItemResult:
    return ItemResult(id=item_id, score=None, status="error", error=message,
                      digest=item_digest(item_id, None, None))


def member(item: ScoreItem) -> Member:
    body = item.model_dump(mode="json", exclude_none=True)
    return Member(item.id, json_digest(body), canonical_json(body).decode())


class HeldGroups:
    """`seam.Holder` over one service's groups file. `start` and `close` run on the event loop
    that serves the requests; every file access runs on this object's one thread."""

    def __init__(self, hold: HoldSettings, clock: Callable[[], float] = time.time) -> None:
        self.hold = hold
        self._clock = clock  # wall time: deadlines are compared across processes
        self._me = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="grm-groups")
        self._store: GroupStore | None = None
        self._events: dict[str, asyncio.Event] = {}
        self._waiters: dict[str, int] = {}
        # Outcomes this process wrote, for its own other waiters of the group: none of them
        # reads the file again for what it was just told.
        self._ended: dict[str, View] = {}
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        bounds = Bounds(self.hold.timeout_s, self.hold.max_open, self.hold.keep_s)
        self._store = await self._call(GroupStore, self.hold.path, bounds)
        self._watch = asyncio.create_task(self._look_for_changes(), name="grm-groups-watch")
        log.info("held groups in %s (pid %d)", self.hold.path, os.getpid())

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._store is not None:
            await self._call(self._store.close)
        self._thread.shutdown(wait=True)

    async def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, lambda: fn(*args, **kwargs))

    @property
    def store(self) -> GroupStore:
        if self._store is None:
            raise RuntimeError("HeldGroups.start was not awaited")
        return self._store

    async def open_groups(self) -> int:
        """Groups the service holds open, in every process (those GRM_GROUP_MAX_OPEN counts)."""
        return await self._call(self.store.open_groups, self._clock())

    @property
    def waiting_groups(self) -> int:
        """Groups this process has waiters of (its only per-group memory)."""
        return len(self._events)

    async def score_held(
        self, group: str, size: int, members: list[ScoreItem], judge: Judge
    ) -> dict[str, ItemResult]:
        label = members[0].group_id or group
        # No wake-up: the joiner waits itself, and claims the group where its items filled it.
        refused = await self._call(self.store.join, group, label, size,
                                   [member(m) for m in members], self._clock())
        results = {i: error_result(i, why) for i, why in refused.items()}
        waiting = [m.id for m in members if m.id not in refused]
        if waiting:
            with self._waiter(group) as event:
                view = await self._until_finished(group, event, judge)
            results.update(_outcome(view, waiting))
        return results

    @contextlib.contextmanager
    def _waiter(self, group: str) -> Iterator[asyncio.Event]:
        event = self._events.setdefault(group, asyncio.Event())
        self._waiters[group] = self._waiters.get(group, 0) + 1
        try:
            yield event
        finally:
            self._waiters[group] -= 1
            if not self._waiters[group]:
                del self._waiters[group], self._events[group]
                self._ended.pop(group, None)

    def _wake(self, group: str) -> None:
        event = self._events.get(group)
        if event is not None:
            event.set()

    async def _until_finished(self, group: str, event: asyncio.Event, judge: Judge) -> View:
        """Wait for the group's outcome; claim and judge it where it is full and unclaimed (or
        its claimer's lease ran out); fail it where it timed out."""
        while True:
            event.clear()  # before the look: a write after it wakes the wait below
            view = self._ended.get(group) or await self._call(self.store.look, group)
            if view is None:  # dropped as stale while nobody waited: its items are gone
                return View(group, 0, State.FAILED, 0, 0.0, 0.0, None,
                            f"group {group!r} is no longer held: send its items again")
            if view.state in (State.DONE, State.FAILED):
                return view
            now = self._clock()
            if view.full and (view.state == State.OPEN or view.lease_until <= now):
                await self._claim_and_judge(group, view.label, judge)
                continue
            if not view.full and now >= view.opened + self.hold.timeout_s:
                await self._call(self.store.expire, group, now)
                self._wake(group)
                continue
            await self._sleep(event, _next_deadline(view, self.hold.timeout_s) - now)

    async def _sleep(self, event: asyncio.Event, seconds: float) -> None:
        # Bounded even where the watch missed nothing: a lost wake-up costs one lease at most.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.001, min(seconds, self.hold.lease_s))):
                await event.wait()  # no task of its own (wait_for's), per waiting request

    async def _claim_and_judge(self, group: str, label: str, judge: Judge) -> None:
        now = self._clock()
        items = await self._call(self.store.claim, group, self._me, now, now + self.hold.lease_s)
        if items is None:
            return
        try:
            await self._judge(group, label, items, judge)
        finally:
            self._wake(group)  # this process's other waiters read the outcome now

    async def _judge(self, group: str, label: str, items: list[str], judge: Judge) -> None:
        renewing = asyncio.create_task(self._renew(group))
        try:
            results = await judge([ScoreItem.model_validate_json(i) for i in items])
        except asyncio.CancelledError:
            # This waiter's request went away: the claim goes back at once, not a lease later.
            await asyncio.shield(self._call(self.store.release, group, self._me))
            raise
        except Exception as err:  # whatever the judge raised, every member hears it
            why = err.message if isinstance(err, GrmError) else repr(err)
            log.warning("judging held group %s failed: %s", label, why)
            error = f"judging group {label!r} failed: {why}"
            if await self._call(self.store.fail, group, self._me, error, self._clock()):
                self._ended[group] = View(label, len(items), State.FAILED, len(items), 0.0,
                                          0.0, None, error)
            return
        finally:
            renewing.cancel()
        ids = [json.loads(i)["id"] for i in items]
        full = {i: results.get(i) or error_result(i, f"the group judge gave item {i!r} of group "
                                                     f"{label!r} no result") for i in ids}
        dumped = json.dumps({i: r.model_dump(mode="json") for i, r in full.items()},
                            separators=(",", ":"))
        if await self._call(self.store.finish, group, self._me, dumped, self._clock()):
            self._ended[group] = View(label, len(ids), State.DONE, len(ids), 0.0, 0.0, dumped,
                                      None)
        else:
            log.warning("held group %s: the claim was taken over before its results were "
                        "written; the other claimer's stand", label)

    async def _renew(self, group: str) -> None:
        while True:
            await asyncio.sleep(self.hold.lease_s / 3)
            if not await self._call(self.store.renew, group, self._me,
                                    self._clock() + self.hold.lease_s):
                return

    async def _look_for_changes(self) -> None:
        """Wake this process's waiters of the groups other processes wrote; drop stale groups
        now and then."""
        seq, pruned = await self._call(self.store.clock), self._clock()
        while True:
            await asyncio.sleep(self.hold.poll_s)
            try:
                if self._events:
                    seq, groups = await self._call(self.store.changed, seq)
                    for group in groups:
                        self._wake(group)
                if self._clock() - pruned >= _PRUNE_EVERY_S:
                    pruned = self._clock()
                    await self._call(self.store.prune, pruned)
            except GrmError as err:  # a busy or failing file: the waits' own bounds hold
                log.warning("held groups: %s", err.message)


def _next_deadline(view: View, timeout_s: float) -> float:
    """When this group changes without a write: it times out, or its claim's lease ends."""
    if not view.full:
        return view.opened + timeout_s
    return view.lease_until


def _outcome(view: View, ids: list[str]) -> dict[str, ItemResult]:
    if view.state == State.FAILED or view.results is None:
        return {i: error_result(i, view.error or f"group {view.label!r} failed") for i in ids}
    results: dict[str, Any] = json.loads(view.results)
    return {i: ItemResult.model_validate(results[i]) if i in results else error_result(
        i, f"group {view.label!r} already has its {view.size} items and item {i!r} is not one "
           "of them") for i in ids}
