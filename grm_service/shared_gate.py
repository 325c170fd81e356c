"""A replica's gate shared by the gateway's worker processes (`--workers N`).

Same verbs and meaning as `replicas.Gate`, across processes: requests that may share a batch hold
the replica together, a request that must run alone excludes every other one on that replica
from every worker, and a waiting exclusive request holds new shared ones back in every worker.

Two layers:
- in the process, a plain `Gate` orders this worker's own requests (its writer preference, and
  this worker's share of `max_inflight_per_replica`: the shares add up to the limit);
- across processes, POSIX record locks on two bytes of one file per run. The *hold* byte is
  read-locked by a process while it has one or more shared holders (counted here: a process
  holds one lock, not one per request) and write-locked by an exclusive holder. The *intent*
  byte is write-locked by a process waiting for exclusive; a reader takes it shared for a moment
  before its read lock, so no new reader gets in while a writer waits.

Why record locks: the kernel drops every lock of a process that dies, so a crashed worker cannot
wedge a replica, and no lock server is needed. Locks are only ever tried without blocking and
polled with a short sleep, so a waiting request stays cancellable by the queue timeout and never
blocks the event loop. Two rules keep POSIX semantics from biting: a process never asks for the
hold byte in a mode other than the one it holds (the local gate sees to that: a second request
would *convert* the process's lock), and the file is opened once per process and kept open
(closing any descriptor of it drops all of the process's locks).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

from grm_service.replicas import Gate

_POLL_FIRST_S = 0.0005
_POLL_MAX_S = 0.005
_UNBOUNDED = 1 << 30


def share_of(capacity: int, worker: int, workers: int) -> int:
    """This worker's part of a per-replica bound; the parts of all workers add up to it."""
    if capacity >= _UNBOUNDED:
        return capacity
    return capacity // workers + int(worker < capacity % workers)


class GateFile:
    """The run's lock file, opened once by each worker process; one `SharedGate` per replica."""

    def __init__(self, path: Path, worker: int, workers: int) -> None:
        self.path = path
        self.worker = worker
        self.workers = workers
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def gate(self, index: int) -> SharedGate:
        """The gate of the replica at `index` in the replica list (the same list everywhere)."""
        return SharedGate(self._fd, 2 * index, self.worker, self.workers)

    def close(self) -> None:
        os.close(self._fd)


class SharedGate(Gate):
    """`Gate`'s interface (a subclass, so a `Replica` takes it as its gate), built around a local
    `Gate` rather than on its state; `inflight` counts this worker's holders only."""

    def __init__(self, fd: int, offset: int, worker: int, workers: int) -> None:
        super().__init__()
        self._local = Gate()
        self._fd = fd
        self._hold = offset
        self._intent = offset + 1
        self._worker = worker
        self._workers = workers
        self._readers = 0  # this process's shared holders that hold the read lock
        self._polling = asyncio.Lock()  # one task per process polls for the read lock

    @property
    def inflight(self) -> int:
        return self._local.inflight

    def _share(self, capacity: int) -> int:
        return share_of(capacity, self._worker, self._workers)

    def try_acquire(self, exclusive: bool, capacity: int = _UNBOUNDED) -> bool:
        # Only one case needs no lock call that could fail after the local slot is taken: this
        # process already holds the read lock and no writer waits anywhere.
        if exclusive or not self._readers or self._writer_waiting():
            return False
        if not self._local.try_acquire(False, self._share(capacity)):
            return False
        self._readers += 1
        return True

    async def acquire(self, exclusive: bool, capacity: int = _UNBOUNDED) -> None:
        await self._local.acquire(exclusive, self._share(capacity))
        try:
            if exclusive:
                await self._lock_exclusive()
            else:
                await self._lock_shared()
        except BaseException:  # the queue timeout cancelled the wait: give the local slot back
            await self._local.release(exclusive)
            raise

    async def release(self, exclusive: bool) -> None:
        if not exclusive:
            self._readers -= 1
        if exclusive or not self._readers:
            self._unlock(self._hold)
        await self._local.release(exclusive)

    async def _lock_shared(self) -> None:
        async with self._polling:
            delay = _POLL_FIRST_S
            while not self._try_shared():
                await asyncio.sleep(delay)
                delay = min(2 * delay, _POLL_MAX_S)

    def _try_shared(self) -> bool:
        if self._readers:
            if self._writer_waiting():
                return False
            self._readers += 1
            return True
        if not self._lock(self._intent, exclusive=False):
            return False
        try:
            held = self._lock(self._hold, exclusive=False)
        finally:
            self._unlock(self._intent)
        if held:
            self._readers = 1
        return held

    async def _lock_exclusive(self) -> None:
        # The local gate lets one exclusive request of this process at a time get here.
        delay = _POLL_FIRST_S
        while not self._lock(self._intent, exclusive=True):
            await asyncio.sleep(delay)
            delay = min(2 * delay, _POLL_MAX_S)
        try:
            delay = _POLL_FIRST_S
            while not self._lock(self._hold, exclusive=True):
                await asyncio.sleep(delay)
                delay = min(2 * delay, _POLL_MAX_S)
        finally:
            self._unlock(self._intent)

    def _writer_waiting(self) -> bool:
        if not self._lock(self._intent, exclusive=False):
            return True
        self._unlock(self._intent)
        return False

    def _lock(self, byte: int, exclusive: bool) -> bool:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.lockf(self._fd, mode | fcntl.LOCK_NB, 1, byte, os.SEEK_SET)
        except OSError:  # EACCES or EAGAIN: another process holds it in a conflicting mode
            return False
        return True

    def _unlock(self, byte: int) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, byte, os.SEEK_SET)
