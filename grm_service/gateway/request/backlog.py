"""The score items a serving process owes: items of the `/v1/score` batches it admitted and has
not scored yet, bounded per replica slot.

The rule: a batch is admitted when the items already owed plus its own stay within
`score_items_per_slot` x the ready replicas' slots, or when nothing is owed (a lone batch is
always taken, up to GRM_MAX_SCORE_ITEMS), or when it brings nothing to owe (a group's items
that wait for the rest of their group: `GRM_GROUP_MAX_OPEN` bounds those). Past it the batch
is refused with 429 and a Retry-After before any of its items runs. An admitted batch's items
are owed service: they wait for their replica's slot as long as it takes
(`exchange._wait_for_slot`), never refused for queue time half-way, which would throw away the
items already scored.

Slots: a replica serves one request at a time where requests run alone on it (an engine
without batch-invariant kernels, `--serialize on`, a replica whose canary failed co-batching),
else GRM_MAX_INFLIGHT_PER_REPLICA. The bound holds per serving process (`serve --workers N`
admits up to N times it).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator

from grm_service.errors import Overloaded

# Retry-After of a refused batch: the estimate of the time until its items would fit, within
# these bounds (seconds).
RETRY_AFTER_MIN_S, RETRY_AFTER_MAX_S = 1.0, 60.0
_SMOOTHING = 0.2  # weight of the newest gap in the per-item time


class Backlog:
    def __init__(self, items_per_slot: int) -> None:
        self.items_per_slot = items_per_slot
        self.owed = 0
        self._last: float | None = None  # when an item was last settled, while owing
        self._per_item_s: float | None = None  # smoothed gap between settled items

    def bound(self, slots: int) -> int:
        return self.items_per_slot * max(slots, 1)

    def check(self, items: int, slots: int) -> None:
        """Raise Overloaded where a batch of `items` would pass the bound."""
        bound = self.bound(slots)
        if not items or not self.owed or self.owed + items <= bound:
            return
        raise Overloaded(
            f"{self.owed} score items already owed service by {max(slots, 1)} replica slot(s) "
            f"and this batch brings {items}: past GRM_SCORE_ITEMS_PER_SLOT="
            f"{self.items_per_slot} x {max(slots, 1)} = {bound}. Retry later, send smaller "
            "batches or fewer at once (GET /v1/capabilities: slots), or raise "
            "GRM_SCORE_ITEMS_PER_SLOT or add replicas",
            retry_after=self._retry_after(self.owed + items - bound))

    @contextlib.contextmanager
    def owe(self, items: int) -> Iterator[Debt]:
        """An admitted batch's items, owed until each is scored (`Debt.settle`) or the batch
        ends."""
        if not self.owed:
            self._last = time.monotonic()
        self.owed += items
        debt = Debt(self, items)
        try:
            yield debt
        finally:
            self.owed -= debt.left
            if not self.owed:
                self._last = None

    def settled_one(self) -> None:
        now = time.monotonic()
        if self._last is not None:  # owing since then: the gap is the time one item took
            gap = now - self._last
            prior = self._per_item_s
            self._per_item_s = gap if prior is None else prior + _SMOOTHING * (gap - prior)
        self._last = now
        self.owed -= 1

    def _retry_after(self, excess: int) -> float:
        """Seconds until `excess` more items are scored, at the recent pace."""
        per_item = self._per_item_s or 0.0
        wait = math.ceil(excess * per_item) if per_item else RETRY_AFTER_MIN_S
        return min(max(float(wait), RETRY_AFTER_MIN_S), RETRY_AFTER_MAX_S)


class Debt:
    """One batch's owed items."""

    def __init__(self, backlog: Backlog, items: int) -> None:
        self._backlog = backlog
        self.left = items

    def settle(self) -> None:
        """One of the batch's items is scored."""
        if self.left:
            self.left -= 1
            self._backlog.settled_one()
