"""The cost of one shared slot on a replica's cross-worker gate (`serve --workers N`):
`acquire(shared)` + `release`, the capacity bound on (GRM_MAX_INFLIGHT_PER_REPLICA), by 1 or
more processes at once on one replica's gate, as N busy workers take it (each its own worker
slot, `--tasks` requests in flight in each, a loop turn between a slot's take and its release;
a loop turn with no slot costs about 1 us of this).

    PYTHONPATH=. python benchmarks/bench_shared_gate.py [--rounds 20000] [--processes 1 2 4 8]

Prints, per number of processes, the median and slowest of their microseconds per slot (each
process times its own rounds, all started together). Run it from two checkouts to compare them
(the gate's file is made in a fresh temp dir).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path

from grm_service.replicas.pool import Gate
from grm_service.worker_side.gates import GateFile


async def _slots(gates: GateFile, rounds: int, capacity: int, tasks: int,
                 replicas: int) -> float:
    """us per slot: `tasks` tasks each taking and freeing slots, a loop turn between, so that
    the process holds the replica's read lock most of the time, as a busy worker does; task i
    on replica i % `replicas` (routing spreads requests over the replicas)."""
    gate_list = [gates.gate(r) for r in range(replicas)]

    async def one(count: int, gate: Gate) -> None:
        for _ in range(count):
            await gate.acquire(False, capacity)
            await asyncio.sleep(0)
            await gate.release(False)

    start = time.perf_counter()
    await asyncio.gather(*(one(rounds // tasks, gate_list[t % replicas]) for t in range(tasks)))
    return (time.perf_counter() - start) / (rounds // tasks * tasks) * 1e6


def _worker(path: str, worker: int, workers: int, load: tuple[int, int, int], go: object,
            results: object) -> None:
    gates = GateFile(Path(path), worker, workers)
    try:
        go.wait()  # type: ignore[attr-defined]
        results.put(asyncio.run(_slots(gates, load[0], 256, *load[1:])))  # type: ignore[attr-defined]
    finally:
        gates.close()


def _together(processes: int, load: tuple[int, int, int]) -> list[float]:
    """Each process's us per slot, all of them on one run's gates at once."""
    ctx = multiprocessing.get_context("fork")
    go, results = ctx.Event(), ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "gates")
        GateFile(Path(path), 0, processes).close()  # made once, before any worker opens it
        procs = [ctx.Process(target=_worker, args=(path, w, processes, load, go, results))
                 for w in range(processes)]
        for p in procs:
            p.start()
        time.sleep(0.2)
        go.set()
        times = [results.get() for _ in procs]
        for p in procs:
            p.join()
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--processes", type=int, nargs="+", default=[1])
    parser.add_argument("--tasks", type=int, default=8, help="requests in flight per process")
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args()
    print(f"{args.replicas} replica(s), {args.tasks} requests in flight per process")
    print("| processes | us per shared slot, acquire + release: median | slowest process |")
    print("|---|---|---|")
    for n in args.processes:
        load = (args.rounds, args.tasks, args.replicas)
        runs = [t for _ in range(args.repeats) for t in _together(n, load)]
        print(f"| {n} | {statistics.median(runs):.2f} | {max(runs):.2f} |", flush=True)


if __name__ == "__main__":
    main()
