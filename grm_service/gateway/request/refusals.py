"""Every refusal for load or state (429, 503): counted by its reason, and logged.

Under overload a line per refused request would flood the log and cost the CPU the overload is
short of, so each reason gets one line at its first refusal and then at most one per
`interval_s`, counting the refusals it stands for; `grm_rejected_total{reason}` counts each one.
The line carries the refusal's own message, which names the setting behind it and what to
change (the client reads the same message).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter

from grm_service.errors import GrmError

log = logging.getLogger(__name__)

INTERVAL_S = 10.0


@dataclass
class _Reason:
    counter: Counter | None
    logged_at: float = float("-inf")
    unlogged: int = 0  # refusals since the last line


class Refusals:
    """One per serving process: the edge (connections, bytes in flight, start-up) and the
    request side (queue, drain, replicas, score backlog) refuse through it."""

    def __init__(self, counter: Counter | None, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._counter = counter
        self._interval_s = interval_s
        self._clock = clock
        self._reasons: dict[str, _Reason] = {}

    def note(self, reason: str, status: int, message: str) -> None:
        """Count one refusal; log it unless this reason was logged within `interval_s`."""
        entry = self._reasons.get(reason)
        if entry is None:
            counter = self._counter.labels(reason=reason) if self._counter is not None else None
            entry = self._reasons[reason] = _Reason(counter)
        if entry.counter is not None:
            entry.counter.inc()
        entry.unlogged += 1
        now = self._clock()
        if now - entry.logged_at < self._interval_s:
            return
        more = (f" ({entry.unlogged} refusals of this reason since the last line)"
                if entry.logged_at > float("-inf") and entry.unlogged > 1 else "")
        log.warning("refused %d (%s): %s%s", status, reason, message, more)
        entry.logged_at, entry.unlogged = now, 0

    def refuse(self, reason: str, err: GrmError) -> GrmError:
        """`err`, noted: `raise refusals.refuse("queue_full", Overloaded(...))`."""
        self.note(reason, err.http_status, err.message)
        return err
