"""The run's gates for `serve --workers N`: each replica's lock file, opened once by each worker
and kept open, one `SharedGate` per replica over it; and what the manager does for a worker that
died.

Why POSIX record locks: the kernel drops every lock of a process that dies, so a crashed worker
cannot wedge a replica, and no lock server is needed; the manager zeroes the dead worker's
counts and wakes every worker's parked tasks (`release_worker`). One file per replica, because
the kernel serializes the record locks of a file (shared_gate.py: what one file for all cost).
A file is opened once per process and kept open: closing any descriptor of it drops all of the
process's locks.
"""

from __future__ import annotations

import os
from pathlib import Path

from grm_service.worker_side.counts import MAX_REPLICAS, SLOTS, Counts, counts_path
from grm_service.worker_side.shared_gate import SharedGate
from grm_service.worker_side.wakeups import Sender, Wakeups


def release_worker(gates: Path, worker: int, workers: int) -> None:
    """A worker died: its shared counts go now (its locks went with it, the kernel saw to that),
    and every worker's parked tasks try again."""
    if counts_path(gates).exists():
        Counts(counts_path(gates), worker, workers).close()  # opening zeroes its slots
    sender = Sender(gates, workers)
    try:
        sender.wake(range(workers))
    finally:
        sender.close()


def _lock_path(gates: Path, index: int) -> Path:
    return gates.with_name(f"{gates.name}.{index}")


class GateFile:
    """The run's gates: each replica's lock file, opened once by each worker process when its
    gate is first asked for, and kept open; one `SharedGate` per replica."""

    def __init__(self, path: Path, worker: int, workers: int) -> None:
        self.path = path
        self.worker = worker
        self.workers = workers
        self._fds: dict[int, int] = {}
        self._gates: list[SharedGate] = []
        self._counts = Counts(counts_path(path), worker, workers)
        self._wakeups = Wakeups(path, worker, workers, on_wake=self.tend)

    def gate(self, index: int) -> SharedGate:
        """The gate of the replica at `index` in the replica list (the same list everywhere)."""
        if not 0 <= index < MAX_REPLICAS:
            raise ValueError(f"at most {MAX_REPLICAS} replicas share gates across workers")
        fd = self._fds.get(index)
        if fd is None:
            fd = self._fds[index] = os.open(_lock_path(self.path, index),
                                            os.O_RDWR | os.O_CREAT, 0o600)
        gate = SharedGate(fd, index, self._counts, self._wakeups)
        self._gates.append(gate)
        return gate

    def tend(self) -> None:
        """Spares back to the shared count wherever another worker waits for a slot: at each
        wake-up this worker receives, and every 50 ms from the replica snapshot's follower (a
        quiet worker's, which keeps no spares, every 250 ms), on the event loop's thread (which
        also starts the inbox's reading there)."""
        self.listen()
        for gate in self._gates:
            gate.tend()

    def quiet(self) -> bool:
        """No request of this worker holds or awaits any replica, and it keeps no spare."""
        return all(gate.quiet() for gate in self._gates)

    def listen(self) -> None:
        """Read this worker's wake-ups on the running loop from now on, parked tasks or not: a
        worker keeping spares is woken by the waiter that needs them."""
        self._wakeups.listen()

    def held(self, index: int) -> int:
        """The slots of the replica at `index` counted over every worker, spares included (a
        look without the count lock: a snapshot, for checks and tests)."""
        return self._counts.total(index)

    def slot_waiters(self, index: int) -> list[int]:
        """Per worker, its tasks waiting for a slot of the replica at `index` (a look at the
        count map without its lock: a snapshot, for checks and tests)."""
        return self._counts.row(SLOTS, index)

    def close(self) -> None:
        self._wakeups.close()
        self._counts.close()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

