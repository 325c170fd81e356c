"""The count map the workers of `serve --workers N` share: per (replica, worker), the shared
holders and the parked tasks, so that `max_inflight_per_replica` holds for the sum over the
workers and a freer knows whom to wake.

Each worker counts its own in its own slots of one memory map (it is each slot's only writer)
and reads the others' rows; a worker takes a slot only if the sum is below the bound, under the
replica's count lock (shared_gate.py), so two workers cannot both take the last one. A fixed
split of the bound between workers was measured first: connections do not spread evenly over
the workers, so a busy worker queued requests at its share while the replica had room (256 OCR
requests on an H200 with 4 workers: 0.62x direct). A worker zeroes its slots when it starts;
the manager zeroes a dead worker's the moment it sees the death (gates.release_worker), not
when the worker is started again.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

# Replica slots in the count map (a sparse file: only the pages used take memory).
MAX_REPLICAS = 4096
# The tables, each [replica][worker]: shared holders, parked tasks, and of those the ones
# waiting for exclusive (the only ones a reader's glance at the intent byte can block) and the
# ones waiting for a slot of the in-flight bound (a freed slot wakes one of them); 1 where the
# worker's writer holds the intent byte (readers look here instead of at the byte); and 1 where
# the worker may keep spares (a task that parks for a slot wakes those workers).
HOLDERS, WAITERS, WRITERS, SLOTS, INTENT, LEASED = 0, 1, 2, 3, 4, 5
TABLES = 6


def counts_path(gates: Path) -> Path:
    return gates.with_name(gates.name + ".counts")


class Counts:
    """Shared holders and parked waiters per (replica, worker), in a memory map every worker
    opens: a worker writes only its own slots, and zeroes them when it starts; the manager
    zeroes a dead worker's (`release_worker`)."""

    def __init__(self, path: Path, worker: int, workers: int) -> None:
        self.worker, self.workers = worker, workers
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            size = TABLES * MAX_REPLICAS * workers * 8
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._slots = memoryview(self._map).cast("q")
        self.zero(worker)

    def _at(self, table: int, replica: int, worker: int) -> int:
        return (table * MAX_REPLICAS + replica) * self.workers + worker

    def zero(self, worker: int) -> None:
        for table in range(TABLES):
            for replica in range(MAX_REPLICAS):
                self._slots[self._at(table, replica, worker)] = 0

    def total(self, replica: int) -> int:
        base = self._at(HOLDERS, replica, 0)
        return sum(self._slots[base:base + self.workers])

    def row(self, table: int, replica: int) -> list[int]:
        base = self._at(table, replica, 0)
        return self._slots[base:base + self.workers].tolist()

    def add(self, replica: int, delta: int) -> None:
        self._slots[self._at(HOLDERS, replica, self.worker)] += delta

    def park(self, replica: int, delta: int, kind: int) -> None:
        """Count a parked task (`delta` 1) or its leaving (-1); `kind` what it waits for:
        WRITERS, SLOTS, or WAITERS for the read lock (counted in that table only)."""
        self._slots[self._at(WAITERS, replica, self.worker)] += delta
        if kind != WAITERS:
            self._slots[self._at(kind, replica, self.worker)] += delta

    def parked_elsewhere(self, replica: int, table: int = WAITERS) -> list[int]:
        """The other workers with a task waiting on `replica` (on every request's start: cheap);
        `table` WRITERS: those waiting for exclusive only."""
        row = self.row(table, replica)
        if not any(row):
            return []
        return [w for w, parked in enumerate(row) if parked and w != self.worker]

    def writers_elsewhere(self, replica: int) -> list[int]:
        return self.parked_elsewhere(replica, WRITERS)

    def slot_waited_for(self, replica: int) -> bool:
        """Some worker, this one included, has a task waiting for a slot of `replica` (a look
        without the count lock: a waiter counted a moment ago may be missed, and is then seen
        at the next request's end or the next `GateFile.tend`)."""
        return any(self.row(SLOTS, replica))

    def intent(self, replica: int, marked: bool) -> None:
        """This worker's writer holds the replica's intent byte (True) or no longer does."""
        self._slots[self._at(INTENT, replica, self.worker)] = int(marked)

    def leased(self, replica: int, marked: bool) -> None:
        """This worker may keep spares of the replica (True), or has given every one back."""
        self._slots[self._at(LEASED, replica, self.worker)] = int(marked)

    def writer_intends(self, replica: int) -> bool:
        """A writer anywhere holds the replica's intent byte (its mark, read without a lock: a
        reader that misses a mark just set delays that writer by one request, never lets a
        shared holder in beside an exclusive one; the hold byte sees to that)."""
        return any(self.row(INTENT, replica))

    def next_slot_waiter(self, replica: int, start: int) -> int | None:
        """The first worker from `start` on, in turn (this one included), with a task waiting
        for a slot of `replica`."""
        row = self.row(SLOTS, replica)
        if not any(row):
            return None
        return next(w % self.workers for w in range(start, start + self.workers)
                    if row[w % self.workers])

    def close(self) -> None:
        self._slots.release()
        self._map.close()

