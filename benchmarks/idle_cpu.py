"""What a gateway costs doing nothing: CPU per second of `serve --workers N` on idle STUB
replicas (health checks, liveness pings, the keeper, timers), the fixed part of CPU per request
that grows with N and weighs most below saturation.

    .venv/bin/python benchmarks/idle_cpu.py [--workers 1 2 4 8] [--seconds 10]

Prints a table: workers, CPU ms per second of the gateway's processes (all workers and the
keeper), and what that adds per request at 1,000 req/s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after ready")
    args = parser.parse_args()
    rows = []
    with procs.fleet() as f:
        backends = [procs.start_stub(f, i).url for i in range(args.replicas)]
        for n in args.workers:
            gw = procs.start_grm(f, backends, f"idle-w{n}", extra=["--workers", str(n)])
            time.sleep(args.settle)
            before = gw.cpu()
            time.sleep(args.seconds)
            per_s = (gw.cpu() - before) / args.seconds
            rows.append(f"| {n} | {per_s * 1e3:.1f} | {per_s / 1000 * 1e6:.0f} |")
            gw.stop()
    print("| workers | idle CPU ms/s | us per request at 1,000 req/s |\n|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
