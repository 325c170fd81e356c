"""Metric updates of the request path, kept in plain numbers and handed to prometheus_client in
one call per series and bucket (`Tally.flush`: every second, and before any read of the
registry).

Why: each prometheus_client update takes a lock, and with `--workers N` (multiprocess mode) it
also reads the pid and writes a memory-mapped file; the seven updates of one request cost ~13 us
of a worker's CPU against ~4 us in one process (benchmarks/RESULTS.md, issue 23). Kept here, they
cost a dict update each. What a scrape sees is the same totals, at most a second late with
`--workers N` (a worker's own /metrics flushes its own tally first; the others' come with their
next flush).

A histogram's observations are counted per bucket here and added to the child's bucket and sum
values; that reads three private attributes of prometheus_client's `Histogram` (`_upper_bounds`,
`_buckets`, `_sum`, there since its first releases). A child without them is observed directly,
value by value, so a future prometheus_client costs speed, not counts.
"""

from __future__ import annotations

import bisect
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

_HISTOGRAM_PARTS = ("_upper_bounds", "_buckets", "_sum")


class _Observed:
    """One histogram child's observations since the last flush, per bucket."""

    def __init__(self, child: Histogram) -> None:
        self.child = child
        self.bounds: list[float] = list(getattr(child, "_upper_bounds", []))
        self.direct = not all(hasattr(child, part) for part in _HISTOGRAM_PARTS)
        self.counts = [0] * len(self.bounds)
        self.total = 0.0

    def add(self, value: float) -> None:
        if self.direct:
            self.child.observe(value)
            return
        # The first bucket whose bound is >= value, as `Histogram.observe` picks it.
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def flush(self) -> None:
        if self.direct or not any(self.counts):
            return
        child: Any = self.child
        child._sum.inc(self.total)
        for index, count in enumerate(self.counts):
            if count:
                child._buckets[index].inc(count)
                self.counts[index] = 0
        self.total = 0.0


class Tally:
    """Pending increments of counters and gauges (`add`; a gauge's may be negative) and a
    histogram's observations (`observe`). Updated and flushed on the event loop's thread (the
    request path, the flush task, `/metrics`), so an update never lands in the middle of a
    flush."""

    def __init__(self) -> None:
        self._adds: dict[Counter | Gauge, float] = {}
        self._observed: dict[Histogram, _Observed] = {}

    def add(self, child: Counter | Gauge, amount: float = 1.0) -> None:
        adds = self._adds
        adds[child] = adds.get(child, 0.0) + amount

    def observe(self, child: Histogram, value: float) -> None:
        observed = self._observed.get(child)
        if observed is None:
            observed = self._observed[child] = _Observed(child)
        observed.add(value)

    def flush(self) -> None:
        adds, self._adds = self._adds, {}
        for child, amount in adds.items():
            if amount:
                child.inc(amount)
        for observed in self._observed.values():
            observed.flush()
