"""What one client may hold of the gateway, shared by every connection of a serving process:
open connections, time per phase of a request, and request bytes in flight.

- A connection idle for `keep_alive_s` is closed: before its first request too (uvicorn arms
  its keep-alive timer only after a response), so a client that connects and sends nothing
  does not hold a file descriptor for ever.
- A request's headers must arrive within `header_timeout_s` of its first byte, and its body
  within `body_timeout_s` of its headers (slow-loris clients); late ones get a 408 and a close.
- A refusal sent before the body was read (the byte budget's 503, an upgrade's 400) is
  followed by a lingering close, nginx's way: the gateway stops writing, then reads and drops
  what the client still sends, and closes: past the body's declared length (a chunked one's:
  `max_body_bytes`), after `linger_s` without a byte, or `body_timeout_s` after the refusal,
  whichever comes first (nginx's `lingering_timeout` and `lingering_time`). Closed
  at once, the socket would answer the client's next bytes with a reset, and the client's
  kernel would drop the refusal it had not read yet.
- At most `max_connections` are open; one more is answered 503 and closed at once.
- Request bodies in flight (received, not yet answered) are bounded by `max_bytes_in_flight`:
  a request whose declared length would pass it gets 503 with Retry-After before its body is
  read. Once more than a quarter of `malloc_keep_bytes` (each byte is held about three times
  at its peak) has come in since freed heap was last handed back to the kernel, and nothing
  has come in for one tick with nothing in flight, it is handed back (`heap.release_freed`):
  the process falls back to what it held before the burst. Waiting for a quiet tick, not for
  the first moment nothing is in flight, is what makes this hold for a burst whose clients
  arrive spread out: such a burst has quiet moments in its middle, and a trim there left the
  rest of it in the heap (seen on a loaded machine: 184 MiB over idle after 40 x 8 MiB).

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
from grm_service.gateway.request.refusals import Refusals


class Expiring(Protocol):
    deadline: float  # time.monotonic() past which `expire` is called

    def expire(self) -> None: ...


class EdgeLimits:
    def __init__(self, settings: Settings, refusals: Refusals | None = None) -> None:
        # A refusal here is counted and logged with the request side's (`Service`).
        self.refusals = refusals if refusals is not None else Refusals(None)
        self.idle_s = float(settings.keep_alive_s)
        self.header_s = settings.header_timeout_s
        self.body_s = settings.body_timeout_s
        self.linger_s = settings.linger_s
        self.linger_bytes = settings.max_body_bytes
        self.max_connections = settings.max_connections
        self.budget = settings.max_bytes_in_flight
        self.keep_bytes = settings.malloc_keep_bytes
        self.tick_s = min(1.0, self.idle_s / 4, self.header_s / 4, self.body_s / 4,
                          self.linger_s / 4)
        self.open: set[Expiring] = set()
        self.now = time.monotonic()  # as of the last sweep: what deadlines are set from
        self.in_flight = 0
        self.moved = 0  # request bytes admitted since freed memory was last handed back
        # past this many bytes moved, freed memory is handed back at the next quiet tick
        self.trim_after = self.keep_bytes // 4 if self.keep_bytes > 0 else math.inf
        self.trim_pending = False
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
        self.moved += size
        return True

    def give(self, size: int) -> None:
        self.in_flight -= size
        if self.in_flight == 0 and self.moved > self.trim_after and not self.trim_pending:
            self.quiet()

    def quiet(self) -> None:
        """Nothing is in flight after a burst: hand its freed memory back if nothing more
        comes in for a tick."""
        self.trim_pending = True
        asyncio.get_running_loop().call_later(self.tick_s, self._trim_if_quiet, self.moved)

    def _trim_if_quiet(self, moved_then: int) -> None:
        if self.in_flight:
            self.trim_pending = False  # the answer that empties the gateway asks again
        elif self.moved != moved_then:
            asyncio.get_running_loop().call_later(self.tick_s, self._trim_if_quiet, self.moved)
        else:
            self.trim_pending = False
            self.moved = 0
            # Off the loop: a trim walks the whole heap (milliseconds after a large burst). A
            # loop that is shutting down has no executor left: the process is exiting anyway.
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().run_in_executor(None, release_freed)

    def _sweep(self) -> None:
        self.now = now = time.monotonic()
        for conn in [conn for conn in self.open if conn.deadline < now]:
            conn.deadline = math.inf
            conn.expire()
        self._timer = (asyncio.get_running_loop().call_later(self.tick_s, self._sweep)
                       if self.open else None)
