"""The cross-process replica gate, with real processes holding it at the same time."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

from grm_service.replicas.pool import Gate
from grm_service.worker_side.gates import GateFile, release_worker

_SPAWN = multiprocessing.get_context("spawn")
_HOLD_S = 0.01
# A spawned process imports before it can hold anything; a loaded machine takes seconds.
_START_S = 120.0


def _await_file(path: Path, what: str) -> None:
    """Until another process has made `path` (it signals that it got that far)."""
    deadline = time.monotonic() + _START_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), what


async def _hold_many(gate: Gate, exclusive: bool, tasks: int, rounds: int,
                     capacity: int = 64) -> list[list[float]]:
    spans: list[list[float]] = []

    async def one() -> None:
        for _ in range(rounds):
            async with gate.slot(exclusive, capacity):
                start = time.monotonic()
                await asyncio.sleep(_HOLD_S)
                spans.append([start, time.monotonic()])

    await asyncio.gather(*(one() for _ in range(tasks)))
    return spans


def _worker(path: str, worker: int, exclusive: bool, tasks: int, rounds: int, out: str,
            go: Barrier, shared_file: bool) -> None:
    """One worker process: `tasks` tasks, each taking the replica's gate `rounds` times."""
    gates = GateFile(Path(path), worker, 2)
    gate = gates.gate(0) if shared_file else Gate()
    go.wait(_START_S)
    spans = asyncio.run(_hold_many(gate, exclusive, tasks, rounds))
    Path(out).write_text(json.dumps(spans))


def _run_pair(tmp_path: Path, shared_file: bool) -> tuple[list[list[float]], list[list[float]]]:
    go = _SPAWN.Barrier(3)
    lock = str(tmp_path / "gates")
    outs = [str(tmp_path / "alone.json"), str(tmp_path / "shared.json")]
    procs = [
        _SPAWN.Process(target=_worker, args=(lock, 0, True, 3, 8, outs[0], go, shared_file)),
        _SPAWN.Process(target=_worker, args=(lock, 1, False, 6, 8, outs[1], go, shared_file)),
    ]
    for proc in procs:
        proc.start()
    go.wait(_START_S)  # both imported and waiting: they start together
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    alone, shared = (json.loads(Path(out).read_text()) for out in outs)
    return alone, shared


def _overlaps(a: list[list[float]], b: list[list[float]]) -> int:
    return sum(1 for x in a for y in b if x[0] < y[1] and y[0] < x[1])


def test_exclusive_in_one_process_excludes_shared_in_another(tmp_path: Path) -> None:
    alone, shared = _run_pair(tmp_path, shared_file=True)
    assert len(alone) == 24 and len(shared) == 48
    assert _overlaps(alone, shared) == 0
    assert _overlaps(alone, alone) == len(alone)  # each span only with itself
    # The shared holders did share: otherwise nothing here was tested concurrently.
    assert _overlaps(shared, shared) > len(shared)


def test_without_the_shared_file_they_overlap(tmp_path: Path) -> None:
    """The same run with a per-process gate: proves the test above can fail."""
    alone, shared = _run_pair(tmp_path, shared_file=False)
    assert _overlaps(alone, shared) > 0


def _hold_exclusive_forever(path: str, ready: str, exclusive: bool = True,
                            capacity: int = 1 << 30) -> None:
    async def hold() -> None:
        await GateFile(Path(path), 0, 2).gate(0).acquire(exclusive, capacity)
        Path(ready).touch()
        await asyncio.sleep(3600)

    asyncio.run(hold())


async def _acquire_within(gate: Gate, exclusive: bool, timeout_s: float) -> bool:
    try:
        async with asyncio.timeout(timeout_s):
            await gate.acquire(exclusive)
    except TimeoutError:
        return False
    await gate.release(exclusive)
    return True


def test_a_dead_holder_frees_the_replica(tmp_path: Path) -> None:
    lock, ready = str(tmp_path / "gates"), tmp_path / "ready"
    holder = _SPAWN.Process(target=_hold_exclusive_forever, args=(lock, str(ready)))
    holder.start()
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    gates = GateFile(Path(lock), 1, 2)
    try:
        gate = gates.gate(0)
        assert not asyncio.run(_acquire_within(gate, False, 0.3)), "held by the other process"
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(10)
        assert asyncio.run(_acquire_within(gate, False, 5))
    finally:
        gates.close()


def _stream_shared(path: str, stop: str, running: str) -> None:
    """Overlapping shared holders, without a gap, until told to stop; `running` once all are."""
    gate = GateFile(Path(path), 1, 2).gate(0)

    async def one() -> None:
        while not Path(stop).exists():
            async with gate.slot(False):
                await asyncio.sleep(0.02)

    async def many() -> None:
        tasks = []
        for _ in range(4):
            tasks.append(asyncio.create_task(one()))
            await asyncio.sleep(0.005)
        Path(running).touch()
        await asyncio.gather(*tasks)

    asyncio.run(many())


def test_a_waiting_exclusive_request_is_not_starved_by_shared_ones(tmp_path: Path) -> None:
    lock, stop, running = str(tmp_path / "gates"), tmp_path / "stop", tmp_path / "running"
    stream = _SPAWN.Process(target=_stream_shared, args=(lock, str(stop), str(running)))
    stream.start()
    try:
        _await_file(running, "the shared stream never started")  # the stream is running
        gates = GateFile(Path(lock), 0, 2)
        try:
            assert asyncio.run(_acquire_within(gates.gate(0), True, 5))
        finally:
            gates.close()
    finally:
        stop.touch()
        stream.join(10)
    assert stream.exitcode == 0


def _hold_bounded(path: str, worker: int, workers: int, tasks: int, capacity: int, out: str,
                  go: Barrier) -> None:
    gate = GateFile(Path(path), worker, workers).gate(0)
    go.wait(_START_S)
    spans = asyncio.run(_hold_many(gate, False, tasks, 6, capacity))
    Path(out).write_text(json.dumps(spans))


def _most_at_once(spans: list[list[float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = held = 0
    for _, step in events:  # an end sorts before a start at the same instant
        held += step
        most = max(most, held)
    return most


def _bounded_run(tmp_path: Path, tasks: list[int], capacity: int) -> list[list[float]]:
    go = _SPAWN.Barrier(len(tasks) + 1)
    lock = str(tmp_path / "gates")
    outs = [str(tmp_path / f"w{w}.json") for w in range(len(tasks))]
    procs = [_SPAWN.Process(target=_hold_bounded,
                            args=(lock, w, len(tasks), n, capacity, outs[w], go))
             for w, n in enumerate(tasks)]
    for proc in procs:
        proc.start()
    go.wait(_START_S)
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    return [span for out in outs for span in json.loads(Path(out).read_text())]


@pytest.mark.parametrize("tasks", [[4, 4], [3, 3, 3, 3]], ids=["2-workers", "4-workers"])
def test_the_inflight_bound_holds_for_the_sum_over_workers(tmp_path: Path,
                                                           tasks: list[int]) -> None:
    """Every slot freed reaches a waiter (else a run ends in a join's timeout), and no more
    than the bound hold at once."""
    spans = _bounded_run(tmp_path, tasks=tasks, capacity=3)
    assert len(spans) == 6 * sum(tasks)
    assert _most_at_once(spans) == 3  # 8 or 12 would overlap without the shared count


def test_one_busy_worker_may_use_the_whole_bound(tmp_path: Path) -> None:
    """Connections do not spread evenly over workers: one worker alone gets every slot (a fixed
    split of the bound would cap it at 2 of 3 here)."""
    spans = _bounded_run(tmp_path, tasks=[5, 0], capacity=3)
    assert _most_at_once(spans) == 3


def _switches() -> int:
    """This thread's voluntary context switches: each sleep of a polling loop is one."""
    for line in Path("/proc/thread-self/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/thread-self/status")


@pytest.mark.parametrize("exclusive", [True, False], ids=["exclusive-holder", "counted-holder"])
def test_a_waiter_sleeps_until_a_dead_holder_is_released(tmp_path: Path, exclusive: bool) -> None:
    """The waiter parks on an event, without polling (a poll every 0.5-5 ms would switch
    hundreds of times a second), and the manager's release of the dead holder wakes it at once:
    its lock went with it (the kernel), its count of the one slot did not (release_worker)."""
    lock, ready = tmp_path / "gates", tmp_path / "ready"
    holder = _SPAWN.Process(target=_hold_exclusive_forever,
                            args=(str(lock), str(ready), exclusive, 1))
    holder.start()
    _await_file(ready, "the holder never held")
    gates = GateFile(lock, 1, 2)

    async def wait_then_release() -> float:
        waiting = asyncio.create_task(gates.gate(0).acquire(False, 1))
        await asyncio.sleep(0.1)  # parked
        before = _switches()
        await asyncio.sleep(1.0)
        assert not waiting.done(), "the replica is held by the other process"
        assert _switches() - before < 50, "the waiter polled"
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGKILL)
        await asyncio.to_thread(holder.join, 10)
        released = time.monotonic()
        release_worker(lock, 0, 2)  # what the manager does when it sees the death
        async with asyncio.timeout(10):
            await waiting
        return time.monotonic() - released

    try:
        assert asyncio.run(wait_then_release()) < 5
    finally:
        gates.close()
        holder.kill()
        holder.join(10)


def _requests_beside_a_held_slot(path: str, ready: str, go: str, requests: int) -> None:
    """Worker 0: holds one shared slot throughout, and meanwhile serves `requests` shared
    requests one after another (each one's start glances at the intent byte)."""
    gate = GateFile(Path(path), 0, 2).gate(0)

    async def serve() -> None:
        await gate.acquire(False)
        Path(ready).touch()
        while not Path(go).exists():
            await asyncio.sleep(0.01)
        for _ in range(requests):
            async with gate.slot(False):
                await asyncio.sleep(0.003)
            await asyncio.sleep(0.003)
        await gate.release(False)

    asyncio.run(serve())


def test_a_request_start_does_not_wake_a_worker_waiting_for_a_slot(tmp_path: Path) -> None:
    """Below saturation every request starts and ends beside parked waiters: the end frees a
    slot (a waiter for one retries, rightly), the start frees nothing a slot waiter wants, so
    it wakes none. Each wake-up is a retry in every parked worker (a herd with N workers)."""
    lock, ready, go = tmp_path / "gates", tmp_path / "ready", tmp_path / "go"
    requests = 100
    other = _SPAWN.Process(target=_requests_beside_a_held_slot,
                           args=(str(lock), str(ready), str(go), requests))
    other.start()
    _await_file(ready, "worker 0 never held its slot")
    gates = GateFile(lock, 1, 2)
    calls = _count_wakeups(gates)

    async def wait_for_the_slot() -> None:
        gate = gates.gate(0)
        waiting = asyncio.create_task(gate.acquire(False, 1))  # worker 0 holds the one slot
        await asyncio.sleep(0.1)
        go.touch()
        async with asyncio.timeout(60):
            await waiting
        await gate.release(False)

    try:
        asyncio.run(wait_for_the_slot())
    finally:
        gates.close()
        other.join(10)
    assert other.exitcode == 0
    # About one wake-up per request's end (fewer where two came in one read); the starts had
    # woken as many again (201 of 100 requests before they stopped).
    assert 0 < calls[0] <= requests * 1.3, calls[0]


def _count_wakeups(gates: GateFile) -> list[int]:
    """The wake-ups `gates`' worker receives from now on (set before its loop reads them)."""
    wakeups = gates._wakeups
    received = wakeups._received
    calls = [0]

    def counted() -> None:
        calls[0] += 1
        received()

    wakeups._received = counted  # type: ignore[method-assign]
    return calls


async def _one_done(tasks: dict[asyncio.Task[None], int]) -> int:
    """The worker whose task ends next, once no other one ends soon after it."""
    done, _ = await asyncio.wait(tasks, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    await asyncio.sleep(0.1)  # a second wake-up, had there been one, has arrived by now
    done = {task for task in tasks if task.done()}
    assert len(done) == 1, f"{len(done)} waiters got the one slot"
    task = done.pop()
    task.result()
    return tasks.pop(task)


def test_a_freed_slot_wakes_one_waiting_worker_in_turn(tmp_path: Path) -> None:
    """Four workers (one process and loop: the wake-ups still go through their sockets), one
    slot: each release wakes the next waiting worker only, not every one (N - 1 failed retries
    per request below saturation), and the turn goes round."""
    files = [GateFile(tmp_path / "gates", worker, 4) for worker in range(4)]
    calls = [_count_wakeups(gates) for gates in files]

    async def take_in_turn() -> list[int]:
        gates = [gates.gate(0) for gates in files]
        await gates[0].acquire(False, 1)
        waiting = {asyncio.create_task(gates[w].acquire(False, 1)): w for w in (1, 2, 3)}
        await asyncio.sleep(0.1)
        assert not any(task.done() for task in waiting), "worker 0 holds the one slot"
        order, holder = [], 0
        while waiting:
            await gates[holder].release(False)
            holder = await _one_done(waiting)
            order.append(holder)
        await gates[holder].release(False)
        return order

    try:
        assert asyncio.run(take_in_turn()) == [1, 2, 3]
    finally:
        for gates in files:
            gates.close()
    assert [c[0] for c in calls] == [0, 1, 1, 1]  # waking all: 0, 1, 2, 3 (6 retries)


def test_a_freed_slot_still_reaches_a_waiter_when_the_woken_one_has_gone(
        tmp_path: Path) -> None:
    """The worker woken for a freed slot lost its waiter to the queue timeout before its loop
    read the wake-up: the slot still reaches the next worker waiting for one (the cancelled
    request's release wakes the waiters, and its waiter's leaving hands the wake-up on)."""
    files = [GateFile(tmp_path / "gates", worker, 3) for worker in range(3)]

    async def cancel_the_woken_one() -> None:
        gates = [gates.gate(0) for gates in files]
        await gates[0].acquire(False, 1)
        first = asyncio.create_task(gates[1].acquire(False, 1))
        second = asyncio.create_task(gates[2].acquire(False, 1))
        await asyncio.sleep(0.1)
        await gates[0].release(False)  # no await that yields: worker 1 is woken, not run yet
        assert first.cancel()
        async with asyncio.timeout(10):
            await second
        await gates[2].release(False)
        with pytest.raises(asyncio.CancelledError):
            await first

    try:
        asyncio.run(cancel_the_woken_one())
    finally:
        for gates in files:
            gates.close()


def test_two_wake_ups_sent_to_one_worker_are_not_lost(tmp_path: Path) -> None:
    """Workers 0 and 3 each free a slot, and each one's turn finds worker 1 first: its one
    waiter takes one slot and hands the other wake-up on, to worker 2."""
    files = [GateFile(tmp_path / "gates", worker, 4) for worker in range(4)]

    async def free_two_at_once() -> None:
        gates = [gates.gate(0) for gates in files]
        await gates[0].acquire(False, 2)
        await gates[3].acquire(False, 2)
        waiting = [asyncio.create_task(gates[w].acquire(False, 2)) for w in (1, 2)]
        await asyncio.sleep(0.1)
        assert not any(task.done() for task in waiting), "workers 0 and 3 hold both slots"
        await gates[0].release(False)
        await gates[3].release(False)
        async with asyncio.timeout(10):
            await asyncio.gather(*waiting)
        for w in (1, 2):
            await gates[w].release(False)

    try:
        asyncio.run(free_two_at_once())
    finally:
        for gates in files:
            gates.close()


def test_a_freed_slot_stays_with_its_worker_but_every_worker_gets_its_turn(
        tmp_path: Path) -> None:
    """Two slots, worker 1 holds one throughout. Worker 0 queues 12 requests for the other:
    its own waiter takes a slot it frees (no other process woken), but at most workers - 1 = 2
    times in a row, so worker 2, waiting all along, is not starved until that queue is empty.

    Worker 0's first holder keeps its slot until worker 2 is seen parked in the count map: with a
    timed wait instead, a stalled loop could run worker 2's first try right after that release,
    before the woken local waiter, and worker 2 would take the slot at once (barging, not turn)."""
    files = [GateFile(tmp_path / "gates", worker, 3) for worker in range(3)]
    holds: list[int] = []

    async def hold(worker: int, gate: Gate, until: asyncio.Event | None = None) -> None:
        async with gate.slot(False, 2):
            holds.append(worker)
            if until is not None:
                await until.wait()
            await asyncio.sleep(0.005)

    async def parked_for_a_slot(worker: int) -> None:
        while not files[0].slot_waiters(0)[worker]:
            await asyncio.sleep(0.001)

    async def busy_worker_beside_a_waiting_one() -> None:
        gates = [gates.gate(0) for gates in files]
        await gates[1].acquire(False, 2)
        all_parked = asyncio.Event()
        local = [asyncio.create_task(hold(0, gates[0], all_parked))]
        local += [asyncio.create_task(hold(0, gates[0])) for _ in range(11)]
        async with asyncio.timeout(20):
            await parked_for_a_slot(0)
            waiting = asyncio.create_task(hold(2, gates[2]))
            await parked_for_a_slot(2)
            all_parked.set()
            await asyncio.gather(*local, waiting)
        await gates[1].release(False)

    try:
        asyncio.run(busy_worker_beside_a_waiting_one())
    finally:
        for gates in files:
            gates.close()
    assert sorted(holds) == [0] * 12 + [2]
    # 12 without the turn; 1 where every freed slot goes by turn (a wake-up for another
    # process every time).
    assert holds.index(2) == 3, holds


def _lock_calls_of_100_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capacity: int) -> tuple[list[int], int]:
    """The files (fds) of the lock calls made by 100 requests on replica 0 of a busy worker
    (one request of its held throughout on replica 0, one on replica 1: the read locks stay
    held), and the slots counted on replica 0 once every request has ended."""
    from grm_service.worker_side import shared_gate

    calls: list[int] = []
    real = shared_gate.fcntl.lockf

    def counted(fd: int, cmd: int, length: int = 0, start: int = 0, whence: int = 0) -> None:
        calls.append(fd)
        real(fd, cmd, length, start, whence)

    gates = GateFile(tmp_path / "gates", 0, 2)
    try:
        first, other = gates.gate(0), gates.gate(1)

        async def slots() -> None:
            await first.acquire(False, capacity)
            await other.acquire(False, capacity)
            monkeypatch.setattr(shared_gate.fcntl, "lockf", counted)
            for _ in range(100):
                await first.acquire(False, capacity)
                await first.release(False)
            monkeypatch.setattr(shared_gate.fcntl, "lockf", real)
            await other.release(False)
            await first.release(False)

        asyncio.run(slots())
        return calls, gates.held(0)
    finally:
        gates.close()


def test_a_busy_worker_makes_four_lock_calls_a_request_on_its_replica_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Near the bound (8, 2 workers), with the read lock already held, a slot costs the count
    lock twice (take, free) and nothing else: each lock call is one the kernel orders against
    every other worker's (benchmarks/gpu/RESULTS.md), and each replica's calls go to that
    replica's file."""
    calls, _ = _lock_calls_of_100_requests(tmp_path, monkeypatch, 8)
    assert len(calls) == 400
    assert len(set(calls)) == 1, "one replica's slots lock that replica's file only"


def test_far_from_the_bound_a_busy_worker_makes_no_lock_call_per_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for 2 x workers x 8 slots, a worker takes 8 at once and its requests take
    and free them as spares: no lock call while one of its requests stays in flight, and
    every spare back once none is."""
    calls, held = _lock_calls_of_100_requests(tmp_path, monkeypatch, 256)
    assert calls == []
    assert held == 0, "every spare went back once the worker had no request"


@pytest.mark.parametrize("by", ["a request's end", "the follower's look", "the waiter's wake-up"])
def test_spares_go_back_when_another_worker_waits_for_a_slot(tmp_path: Path, by: str) -> None:
    """Worker 0 holds one request and 7 spares of its lease; worker 1 fills the rest of the
    bound of 40 and waits: the spares reach it at worker 0's next request's end, at the
    follower's look (`GateFile.tend`), or at once, when worker 0 (reading its inbox) is woken
    by the waiter as it parks; and the bound holds throughout."""
    files = [GateFile(tmp_path / "gates", worker, 2) for worker in range(2)]

    def held() -> int:
        return files[0].held(0)

    async def fill_then_wait() -> None:
        first, second = (gates.gate(0) for gates in files)
        await first.acquire(False, 40)  # a lease of 8: room 40 >= 2 x 2 x 8
        assert held() == 8
        for _ in range(32):
            await second.acquire(False, 40)
        assert held() == 40
        if by == "the waiter's wake-up":
            files[0].listen()  # as the follower's first look does in a worker
        waiting = asyncio.create_task(second.acquire(False, 40))
        if by == "the follower's look":
            await asyncio.sleep(0.1)
            assert not waiting.done(), "the bound is reached: 8 held by worker 0, 32 by worker 1"
            files[0].tend()
        elif by == "a request's end":
            await asyncio.sleep(0.1)
            assert not waiting.done(), "the bound is reached: 8 held by worker 0, 32 by worker 1"
            await first.acquire(False, 40)  # a spare, no lock
            await first.release(False)  # the end of a request sees the waiter
        # else nobody but the waiter acts (no follower runs here)
        await asyncio.wait_for(waiting, 5)
        assert held() == 34, "worker 0's request and worker 1's 33"
        for _ in range(33):
            await second.release(False)
        await first.release(False)
        assert held() == 0

    try:
        asyncio.run(fill_then_wait())
    finally:
        for gates in files:
            gates.close()


def test_a_worker_is_quiet_only_when_it_holds_keeps_and_awaits_nothing(tmp_path: Path) -> None:
    """The replica snapshot's follower looks less often while `quiet()` (snapshot.py): never
    while a request holds a slot or waits for one, nor while the worker keeps spares."""
    gates = GateFile(tmp_path / "gates", 0, 2)

    async def run() -> list[bool]:
        seen = [gates.quiet()]  # no gate asked for yet
        gate = gates.gate(0)
        seen.append(gates.quiet())
        async with gate.slot(False, 64):
            seen.append(gates.quiet())
            async with gate.slot(False, 64):
                seen.append(gates.quiet())
        seen.append(gates.quiet())  # the last request out gives its spares back
        async with gate.slot(True):
            seen.append(gates.quiet())
        seen.append(gates.quiet())
        return seen

    try:
        assert asyncio.run(run()) == [True, True, False, False, True, False, True]
    finally:
        gates.close()
