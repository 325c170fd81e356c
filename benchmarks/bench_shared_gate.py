"""The cost of one shared slot on a replica's cross-worker gate (`serve --workers N`), uncontended:
`acquire(shared)` + `release`, one process, the capacity bound on (GRM_MAX_INFLIGHT_PER_REPLICA).

    PYTHONPATH=. python benchmarks/bench_shared_gate.py [--rounds 20000]

Run it from two checkouts to compare them (the gate's file is made in a fresh temp dir).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from grm_service.replicas.shared_gate import GateFile


async def _slots(gates: GateFile, rounds: int, capacity: int) -> float:
    gate = gates.gate(0)
    start = time.perf_counter()
    for _ in range(rounds):
        await gate.acquire(False, capacity)
        await gate.release(False)
    return (time.perf_counter() - start) / rounds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        gates = GateFile(Path(tmp) / "gates", 0, 2)
        try:
            runs = [asyncio.run(_slots(gates, args.rounds, 256)) for _ in range(args.repeats)]
        finally:
            gates.close()
    print("| shared slot, acquire + release (us) | median | min |")
    print("|---|---|---|")
    print(f"| {args.rounds} rounds x {args.repeats} | {statistics.median(runs):.2f} | "
          f"{min(runs):.2f} |")


if __name__ == "__main__":
    main()
