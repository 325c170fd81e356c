"""Live audit: a sample of real requests is re-run on another replica and the outputs compared.

Off the hot path (a background task after the answer is sent), rate-limited, and only while two
or more replicas are ready. A mismatch is a determinism violation: counted, logged with both
fingerprints, and kept for `GET /v1/audit`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from grm_service.fingerprint import Fingerprint
from grm_service.metrics import Metrics

log = logging.getLogger(__name__)

Rerun = Callable[[str, dict[str, Any], str], Awaitable[Fingerprint]]
_KEEP = 100


class Auditor:
    def __init__(self, fraction: float, max_per_s: float, metrics: Metrics,
                 rng: random.Random | None = None) -> None:
        self.fraction = fraction
        self.max_per_s = max_per_s
        self.metrics = metrics
        self.rng = rng or random.Random()
        self.audited = 0
        self.matched = 0
        self.skipped = 0
        self.violations: deque[dict[str, Any]] = deque(maxlen=_KEEP)
        self._tokens = max_per_s
        self._last = time.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()

    def _take_token(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.max_per_s, self._tokens + (now - self._last) * self.max_per_s)
        self._last = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def submit(self, path: str, body: dict[str, Any], first: Fingerprint,
               others: list[str], rerun: Rerun) -> None:
        if not self.draw():
            return
        other = self.choose(others)
        if other is not None:
            self.start(path, body, first, other, rerun)

    def draw(self) -> bool:
        """Whether this request is in the sampled fraction: the first, cheapest step, so the
        proxy looks for replicas to ask and builds the fingerprint object only then."""
        return self.fraction > 0 and self.rng.random() < self.fraction

    def choose(self, others: list[str]) -> str | None:
        """The replica a sampled request is re-run on, within the rate limit."""
        if not others:
            return None
        if not self._take_token():
            self.skipped += 1
            self.metrics.audits.labels(outcome="rate_limited").inc()
            return None
        return others[self.rng.randrange(len(others))]

    def start(self, path: str, body: dict[str, Any], first: Fingerprint, other: str,
              rerun: Rerun) -> None:
        task = asyncio.create_task(self._check(path, body, first, other, rerun),
                                   name="grm-audit")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _check(self, path: str, body: dict[str, Any], first: Fingerprint,
                     other: str, rerun: Rerun) -> None:
        try:
            second = await rerun(path, body, other)
        except Exception as err:  # an audit must never hurt serving, whatever went wrong
            self.metrics.audits.labels(outcome="error").inc()
            log.warning("audit re-run on %s failed: %r", other, err)
            return
        self.audited += 1
        if second.response_digest == first.response_digest:
            self.matched += 1
            self.metrics.audits.labels(outcome="match").inc()
            return
        self.metrics.audits.labels(outcome="violation").inc()
        self.metrics.violations.labels(source="audit").inc()
        record = {"path": path, "at": time.time(), "first": first.model_dump(),
                  "second": second.model_dump()}
        self.violations.append(record)
        log.error("determinism violation: %s on %s vs %s on %s (request %s)",
                  first.response_digest, first.replica, second.response_digest, second.replica,
                  first.request_digest)

    def report(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "max_per_s": self.max_per_s,
                "audited": self.audited, "matched": self.matched,
                "violations": self.audited - self.matched, "rate_limited": self.skipped,
                "in_progress": len(self._tasks), "recent_violations": list(self.violations)}

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
