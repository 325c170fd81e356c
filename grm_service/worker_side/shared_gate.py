"""A replica's gate shared by the gateway's worker processes (`--workers N`).

Same verbs and meaning as `replicas.Gate`, across processes: requests that may share a batch hold
the replica together, a request that must run alone excludes every other one on that replica
from every worker, and a waiting exclusive request holds new shared ones back in every worker.

Three parts:
- in the process, a plain `Gate` orders this worker's own requests (its writer preference);
- `max_inflight_per_replica` holds for the sum over workers, counted in the count map
  (counts.py) and taken under the replica's count lock;
- across processes, POSIX record locks on bytes of the replica's file (gates.py says why record
  locks, and why the file stays open). The *hold* byte is read-locked by a process while it
  has one or more shared holders (counted here: a process holds one lock, not one per request)
  and write-locked by an exclusive holder. The *intent* byte is write-locked by a process
  waiting for exclusive; a process's first reader takes it shared for a moment before its read
  lock, so no new reader gets in while a writer waits. A process that already holds the read
  lock looks at the writers' *intent* marks in the count map instead (a writer marks its slot
  while it holds the intent byte): no lock call. A process never asks for the hold byte in a
  mode other than the one it holds (the local gate sees to that): a second request would
  *convert* the process's lock.

Why so few lock calls, and one file per replica: every request took six to eight, all on one
file, and the kernel serializes the record locks of a file. Eight busy workers each paid 13x
what one did for a slot (benchmarks/gpu/RESULTS.md, the shared gate alone), and CPU per request
grew with the number of workers. Now a request in a process already holding the read lock makes
at most four, on its replica's file (the count lock to take a slot, and to free it), and none
while the bound is far:

- far from the bound (room for 2 x workers x `_LEASE` slots or more), a worker takes `_LEASE`
  slots at once and keeps the ones no request holds as *spares*, counted in its holders: the
  bound stays exact, since a spare is a slot held. A request takes a spare without a lock call
  and gives its slot back as a spare. Spares go back to the shared count when the worker has no
  request left on the replica, when it holds more than `_LEASE`, and when any worker waits for a
  slot: seen at each request's end here, and when the waiter parks, since it wakes every worker
  that marks a lease in the count map, whose inbox then looks (`GateFile.tend`); the follower's
  look every 50 ms (while the worker holds, keeps or awaits anything) is the backstop for a
  mark set just after the waiter read it;
- near the bound, slots are taken and freed one at a time, each under the count lock, as the
  wake-ups below describe.

Waiting, without polling: locks are only ever tried without blocking (a waiting request stays
cancellable by the queue timeout and never blocks the event loop). A request that must wait
parks on an event (wakeups.py), after counting itself in its worker's *waiters* slot of the
replica, and in the slot of what it waits for: *writers* (the exclusive lock) or *slots* (one of
the in-flight bound's). Both the waiter's count and the freer's read are made under the
replica's count lock, and the waiter tries again after counting itself, so a freer either sees
the waiter or the waiter's next try sees what was freed. One task per process and replica waits
for each kind of thing at a time, so a wake-up retries a few tasks, not every queued request.

Who is woken:
- a freed slot wakes *one* worker waiting for a slot (one worker could take it; waking every
  one cost N - 1 failed retries per request below saturation, benchmarks/gpu/RESULTS.md): this
  worker's own waiter, which wakes no other process, at most N - 1 times in a row, else the
  next worker in turn after the last one this process woke. A slot waiter that leaves, with a slot
  or without (its queue timeout), hands the wake-up on while a slot is still free and another
  worker waits for one, so a wake-up whose waiter has gone, or two sent to one worker, is not
  lost;
- a freed hold byte wakes the writers; a writer's end wakes every waiter (rare, and any of
  them may go on);
- a reader's momentary hold of the intent byte, which every request takes, wakes only the
  writers (its look at the counts takes no lock: every step involved there is a lock call on
  the same file, which the kernel orders).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Callable

from grm_service.replicas.pool import Gate
from grm_service.worker_side.counts import LEASED, SLOTS, WAITERS, WRITERS, Counts
from grm_service.worker_side.wakeups import Wakeups

_UNBOUNDED = 1 << 30
_HOLD, _INTENT_BYTE, _COUNT_LOCK = 0, 1, 2  # lock bytes of a replica's file
_COUNT_LOCK_TRIES = 4
# Slots a worker takes at once while the bound is far (module doc): 8 requests per count-lock
# section, and at most 8 x workers slots held unused, kept only while there is room for twice
# that (a waiter near the bound gets them within the follower's 50 ms look).
_LEASE = 8


def _lease_room(workers: int) -> int:
    """The room under the bound from which slots are taken `_LEASE` at a time and kept as
    spares: enough for every worker's spares twice over."""
    return 2 * workers * _LEASE


class SharedGate(Gate):
    """`Gate`'s interface (a subclass, so a `Replica` takes it as its gate), built around a local
    `Gate` rather than on its state; `inflight` counts this worker's holders only."""

    def __init__(self, fd: int, index: int, counts: Counts, wakeups: Wakeups) -> None:
        super().__init__()
        self._local = Gate()
        self._fd = fd
        self._index = index
        self._counts = counts
        self._wakeups = wakeups
        self._readers = 0  # this process's shared holders that hold the read lock
        self._parked = 0  # this process's tasks waiting on this replica
        self._turn = counts.worker + 1  # where the next look for a slot waiter starts
        self._kept = 0  # slots freed here in a row that went to this worker's own waiter
        self._spare = 0  # slots counted in this worker's holders that no request holds
        self._leased = False  # this worker's lease mark in the count map (may keep spares)
        self._capacity = _UNBOUNDED  # the bound the last slot was taken under
        self._locking = asyncio.Lock()  # one task per process waits for the read lock
        self._counting = asyncio.Lock()  # and one for a shared slot

    @property
    def inflight(self) -> int:
        return self._local.inflight

    def quiet(self) -> bool:
        return not (self._local.inflight or self._parked or self._spare or self._readers
                    or self._locking.locked() or self._counting.locked())

    def try_acquire(self, exclusive: bool, capacity: int = _UNBOUNDED) -> bool:
        # Only one case needs no lock call that could fail after the local slot is taken: this
        # process already holds the read lock and no writer waits anywhere.
        if exclusive or not self._readers or self._writer_waiting():
            return False
        if not self._take_count(capacity):
            return False
        if not self._local.try_acquire(False, capacity):
            self._spare += 1  # still counted; a request in flight here gives it back in time
            return False
        self._readers += 1
        return True

    async def acquire(self, exclusive: bool, capacity: int = _UNBOUNDED) -> None:
        await self._local.acquire(exclusive, capacity)
        try:
            if exclusive:
                await self._lock_exclusive()
            elif self._locking.locked() or not self._try_shared():  # else: no wait, no queue
                async with self._locking:
                    await self._until(self._try_shared, WAITERS)
        except BaseException:  # the queue timeout cancelled the wait: give the local slot back
            await self._local.release(exclusive)
            raise
        if exclusive:
            return
        try:
            if self._counting.locked() or not self._take_count(capacity):
                async with self._counting:
                    await self._until(lambda: self._take_count(capacity), SLOTS, capacity)
        except BaseException:
            await self.release(False, counted=False)
            raise

    async def release(self, exclusive: bool, counted: bool = True) -> None:
        if not exclusive:
            self._readers -= 1
        unlocked = exclusive or not self._readers
        if unlocked:
            self._unlock(_HOLD)
        if counted and not exclusive:
            self._spare += 1
            giving = unlocked or self._spare > _LEASE or not self._keeps_spares()
            if not giving and not self._leased:
                self._mark_lease(True)
                # A waiter that parked before the mark could not see it: look once more.
                giving = self._counts.slot_waited_for(self._index)
            if giving:
                self._give_back(unlocked)
        else:
            self._changed()
        await self._local.release(exclusive)

    def _keeps_spares(self) -> bool:
        """Far from the bound and no worker waiting for a slot (looks without the lock)."""
        room = self._capacity - self._counts.total(self._index)
        return (room >= _lease_room(self._counts.workers)
                and not self._counts.slot_waited_for(self._index))

    def tend(self) -> None:
        """This worker's spares back to the shared count if any worker waits for a slot."""
        if self._spare and self._counts.slot_waited_for(self._index):
            self._give_back(unlocked=False)

    def _give_back(self, unlocked: bool) -> None:
        """Every spare back to the shared count, and who may use them woken: a waiter for a
        slot and, once this process has dropped the read lock (`unlocked`), the writers."""
        self._lock_counts()
        try:
            self._counts.add(self._index, -self._spare)
            self._spare = 0
            if self._leased:
                self._mark_lease(False)
            waiter = self._slot_goes_to()
            writers = self._counts.writers_elsewhere(self._index) if unlocked else []
        finally:
            self._unlock(_COUNT_LOCK)
        self._wake_one(waiter)
        if writers:
            self._wakeups.wake(writers)

    async def _until(self, attempt: Callable[[], bool], kind: int,
                     capacity: int = _UNBOUNDED) -> None:
        """Until `attempt()` succeeds, woken by the changes to the replica that `kind` waits for
        (module doc): WAITERS the read lock, WRITERS the exclusive one, SLOTS one of
        `capacity` slots."""
        if attempt():
            return
        self._parked += 1
        self._lock_counts()
        try:
            self._counts.park(self._index, 1, kind)
            # Spares kept elsewhere come back at once, not at the follower's next look.
            leasing = self._counts.parked_elsewhere(self._index, LEASED) if kind == SLOTS else []
        finally:
            self._unlock(_COUNT_LOCK)
        if leasing:
            self._wakeups.wake(leasing)
        try:
            while True:
                woken = self._wakeups.event()
                if attempt():
                    return
                await woken.wait()
        finally:
            self._unpark(kind, capacity)

    def _unpark(self, kind: int, capacity: int) -> None:
        """A parked task leaves; a slot waiter hands a wake-up on while a slot is free."""
        self._parked -= 1
        waiter = None
        self._lock_counts()
        try:
            self._counts.park(self._index, -1, kind)
            if kind == SLOTS and self._counts.total(self._index) < capacity:
                waiter = self._next_slot_waiter()
        finally:
            self._unlock(_COUNT_LOCK)
        self._wake_one(waiter)

    def _slot_goes_to(self) -> int | None:
        """Who a slot freed here wakes (under the count lock): this worker's own waiter, which
        costs no other process a wake-up, but at most `workers - 1` times in a row, so every
        worker waiting gets its turn."""
        if self._counting.locked() and self._kept < self._counts.workers - 1:
            self._kept += 1
            return self._counts.worker
        self._kept = 0
        return self._next_slot_waiter()

    def _next_slot_waiter(self) -> int | None:
        """The next worker in turn waiting for a slot (call it under the count lock)."""
        waiter = self._counts.next_slot_waiter(self._index, self._turn)
        if waiter is not None:
            self._turn = waiter + 1
        return waiter

    def _wake_one(self, worker: int | None) -> None:
        if worker == self._counts.worker:
            self._wakeups.wake_here()
        elif worker is not None:
            self._wakeups.wake([worker])

    def _changed(self) -> None:
        """Something on this replica was freed: wake whoever waits for it, anywhere."""
        self._lock_counts()
        try:
            elsewhere = self._counts.parked_elsewhere(self._index)
        finally:
            self._unlock(_COUNT_LOCK)
        self._wake(elsewhere)

    def _wake(self, elsewhere: list[int]) -> None:
        if elsewhere:
            self._wakeups.wake(elsewhere)
        if self._parked:
            self._wakeups.wake_here()

    def _lock_counts(self) -> None:
        # Held for a few instructions by whoever has it: a few tries without blocking first,
        # since a blocked process is put to sleep and woken by the holder's unlock, which costs
        # both more than the tries; then blocking, shorter than polling.
        for _ in range(_COUNT_LOCK_TRIES):
            if self._lock(_COUNT_LOCK, exclusive=True):
                return
        fcntl.lockf(self._fd, fcntl.LOCK_EX, 1, _COUNT_LOCK, os.SEEK_SET)

    def _take_count(self, capacity: int) -> bool:
        """One of the replica's `capacity` shared slots, counted over every worker: a spare of
        this worker's, or taken under the count lock (a lease of `_LEASE` while the bound is
        far, the one slot asked for near it)."""
        self._capacity = capacity
        if self._spare:
            self._spare -= 1
            return True
        if capacity >= _UNBOUNDED:
            self._counts.add(self._index, 1)
            return True
        self._lock_counts()
        try:
            room = capacity - self._counts.total(self._index)
            if room <= 0:
                return False
            taken = _LEASE if room >= _lease_room(self._counts.workers) else 1
            self._counts.add(self._index, taken)
            self._spare = taken - 1
            if taken > 1 and not self._leased:
                self._mark_lease(True)
            return True
        finally:
            self._unlock(_COUNT_LOCK)

    def _mark_lease(self, marked: bool) -> None:
        self._leased = marked
        self._counts.leased(self._index, marked)

    def _try_shared(self) -> bool:
        if self._readers:
            if self._writer_waiting():
                return False
            self._readers += 1
            return True
        if not self._lock(_INTENT_BYTE, exclusive=False):
            return False
        try:
            held = self._lock(_HOLD, exclusive=False)
        finally:
            self._unlock_intent_glance()
        if held:
            self._readers = 1
        return held

    async def _lock_exclusive(self) -> None:
        # The local gate lets one exclusive request of this process at a time get here.
        await self._until(lambda: self._lock(_INTENT_BYTE, exclusive=True), WRITERS)
        self._counts.intent(self._index, True)
        try:
            await self._until(lambda: self._lock(_HOLD, exclusive=True), WRITERS)
        finally:
            self._counts.intent(self._index, False)
            self._unlock(_INTENT_BYTE)
            self._changed()

    def _writer_waiting(self) -> bool:
        return self._counts.writer_intends(self._index)

    def _unlock_intent_glance(self) -> None:
        """End a first reader's momentary shared hold of the intent byte: a writer whose try met
        it waits for the byte (see the module doc for why no lock is needed to read the
        waiters). Only writers: waking the tasks that wait for a shared slot too cost every
        parked worker a retry per glance (benchmarks/gpu/RESULTS.md, workers below
        saturation)."""
        self._unlock(_INTENT_BYTE)
        if elsewhere := self._counts.writers_elsewhere(self._index):
            self._wakeups.wake(elsewhere)

    def _lock(self, byte: int, exclusive: bool) -> bool:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.lockf(self._fd, mode | fcntl.LOCK_NB, 1, byte, os.SEEK_SET)
        except OSError:  # EACCES or EAGAIN: another process holds it in a conflicting mode
            return False
        return True

    def _unlock(self, byte: int) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, byte, os.SEEK_SET)
