"""What one client may hold of the gateway, shared by every connection of a serving process:
open connections, time per phase of a request, and request bytes in flight.

- A connection idle for `keep_alive_s` is closed: before its first request too (uvicorn arms
  its keep-alive timer only after a response), so a client that connects and sends nothing
  does not hold a file descriptor for ever.
- A request's headers must arrive within `header_timeout_s` of its first byte, and its body
  within `body_timeout_s` of its headers (slow-loris clients); late ones get a 408 and a close.
- At most `max_connections` are open; one more is answered 503 and closed at once.
- Request bodies in flight (received, not yet answered) are bounded by `max_bytes_in_flight`:
  a request whose declared length would pass it gets 503 with Retry-After before its body is
  read. Once a burst that held more than a quarter of `malloc_keep_bytes` (each byte is held
  about three times at its peak) is answered, freed heap is handed back to the kernel
  (`heap.release_freed`): the process falls back to what it held before the burst.

Deadlines are checked by one timer per process, every `tick_s`, and set from the clock as of
its last run, not a timer or a clock read per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Protocol

from grm_service.config import Settings
from grm_service.gateway.heap import release_freed


class Expiring(Protocol):
    deadline: float  # time.monotonic() past which `expire` is called

    def expire(self) -> None: ...


class EdgeLimits:
    def __init__(self, settings: Settings) -> None:
        self.idle_s = float(settings.keep_alive_s)
        self.header_s = settings.header_timeout_s
        self.body_s = settings.body_timeout_s
        self.max_connections = settings.max_connections
        self.budget = settings.max_bytes_in_flight
        self.keep_bytes = settings.malloc_keep_bytes
        self.tick_s = min(1.0, self.idle_s / 4, self.header_s / 4, self.body_s / 4)
        self.open: set[Expiring] = set()
        self.now = time.monotonic()  # as of the last sweep: what deadlines are set from
        self.in_flight = 0
        self.peak = 0  # the most bytes in flight since memory was last handed back
        # a burst past this many bytes in flight hands freed memory back once it is answered
        self.trim_after = self.keep_bytes // 4 if self.keep_bytes > 0 else math.inf
        self._timer: asyncio.TimerHandle | None = None

    def opened(self, conn: Expiring) -> bool:
        """Count a new connection; False when it is one too many (it is not counted)."""
        if len(self.open) >= self.max_connections:
            return False
        self.now = time.monotonic()
        conn.deadline = self.now + self.idle_s
        self.open.add(conn)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.tick_s, self._sweep)
        return True

    def closed(self, conn: Expiring) -> None:
        self.open.discard(conn)

    def take(self, size: int) -> bool:
        """Reserve `size` request bytes; False when the budget has no room for them. (The
        protocol inlines this and `give` on its per-request path.)"""
        if size > self.budget - self.in_flight:
            return False
        self.in_flight += size
        if self.in_flight > self.peak:
            self.peak = self.in_flight
        return True

    def give(self, size: int) -> None:
        self.in_flight -= size
        if self.in_flight == 0 and self.peak > self.trim_after:
            self.trimmed()

    def trimmed(self) -> None:
        """A burst is answered: hand its freed memory back."""
        self.peak = 0
        # Off the loop: a trim walks the whole heap (milliseconds after a large burst). A loop
        # that is shutting down has no executor left: the process is exiting anyway.
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().run_in_executor(None, release_freed, self.keep_bytes)

    def _sweep(self) -> None:
        self.now = now = time.monotonic()
        for conn in [conn for conn in self.open if conn.deadline < now]:
            conn.deadline = math.inf
            conn.expire()
        self._timer = (asyncio.get_running_loop().call_later(self.tick_s, self._sweep)
                       if self.open else None)
