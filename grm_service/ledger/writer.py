"""Batched writes off the event loop.

Answers are appended to a buffer as rows (`store.row`: a tuple append on the loop); every
`flush_interval_s` the buffer is handed to the writer's one thread, which finishes the rows
(joins the bodies, encodes the rare payload the engine did not send as bytes) and commits them
in one transaction. A SIGKILL therefore loses at most the records answered within the last interval
(plus the batch being committed), and a commit is all or nothing.

The store failing (a full disk, PostgreSQL unreachable) never fails or slows an answer: the
batch is dropped and counted (`grm_ledger_dropped_records`), a warning is logged at most once a
minute, and the next batch tries again. A buffer that outgrows `max_bytes` (a store slower than
the traffic: each record holds its request body until it is written) drops its oldest records
the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import Counter

from grm_service.errors import LedgerUnavailable
from grm_service.ledger.store import Store, finished

log = logging.getLogger(__name__)

_LOG_EVERY_S = 60.0
_PRUNE_EVERY_S = 30.0
# A record as the request path leaves it (`store.row`): `store.finished` is the writer's work.
Pending = tuple[Any, ...]


class Writer:
    def __init__(self, open_store: Callable[[], Store], flush_interval_s: float,
                 max_bytes: int, bounds: tuple[int, float], written: Counter,
                 dropped: Counter) -> None:
        self._open_store = open_store
        self._store: Store | None = None
        self.interval = flush_interval_s
        self.max_bytes = max_bytes
        self.bounds = bounds  # (max bytes, max age in seconds)
        self._buffer: deque[tuple[Pending, int]] = deque()
        self._buffered = 0  # bytes the buffer holds
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grm-ledger-writer")
        self._written, self._dropped = written, dropped
        self.dropped = 0
        self._logged_at = -_LOG_EVERY_S
        self._pruned_at = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="grm-ledger-writer")

    def add(self, pending: Pending, size: int) -> None:
        """`size`: about what the record holds in memory until it is written."""
        self._buffer.append((pending, size))
        self._buffered += size
        while self._buffered > self.max_bytes and len(self._buffer) > 1:
            self._buffered -= self._buffer.popleft()[1]
            self._drop(1, "buffer full: the store does not keep up")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.flush()

    async def flush(self) -> None:
        if not self._buffer and self._store is not None and not self._prune_due():
            # Idle: a hand-off to the thread and back would wake both for nothing, twice a
            # second, in every worker.
            return
        batch = [pending for pending, _ in self._buffer]
        self._buffer.clear()
        self._buffered = 0
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._write, batch)

    def _prune_due(self) -> bool:
        return time.monotonic() - self._pruned_at >= _PRUNE_EVERY_S

    def _write(self, batch: list[Pending]) -> None:
        """On the writer thread: encode, commit, now and then prune."""
        try:
            store = self._store = self._store or self._open_store()
            if batch:
                store.write_rows([finished(pending) for pending in batch])
                self._written.inc(len(batch))
            if self._prune_due():
                self._pruned_at = time.monotonic()
                store.prune(*self.bounds)
        except LedgerUnavailable as err:
            self._drop(len(batch), err.message)
        except Exception as err:  # a record that cannot be encoded must not stop the ledger
            self._drop(len(batch), repr(err))

    def _drop(self, count: int, why: str) -> None:
        if not count:
            return
        self.dropped += count
        self._dropped.inc(count)
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY_S:
            self._logged_at = now
            log.warning("ledger: %d record(s) dropped so far (%s); answers go on", self.dropped,
                        why)

    async def close(self) -> None:
        """Flush what is buffered and close the store (the lifespan's end)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.flush()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._close_store)
        self._pool.shutdown()

    def _close_store(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def report(self) -> dict[str, Any]:
        return {"buffered": len(self._buffer), "buffered_bytes": self._buffered,
                "dropped": self.dropped}
