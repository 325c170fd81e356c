"""What a CPU replica costs between requests: vLLM's engine core and worker busy-poll their
shared-memory queue for a while after each message, so a replica that gets requests spaced
apart burns CPU while it waits.

Starts one `grm-service replica` on the tiny text model with the test suite's flags, then sends
the same requests (8 tokens, logprobs) one at a time with a pause of each `--gaps` value between
them, and prints per gap: the wall time, the replica's CPU (its whole process tree), that CPU
per second of wall, and the requests' latency. One replica per value of the worker's busy loop
(`GRM_CPU_WORKER_BUSY_LOOP_S`, grm_service/engine_side/worker_poll.py), one after the other.

    .venv/bin/python benchmarks/engine_poll.py [--requests N] [--gaps 0 2] [--busy-loops 1 0.05]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness import cpu, procs, servers


def one_gap(proc: procs.Proc, gap: float, requests: int) -> tuple[float, float, list[float]]:
    """(wall s, the replica's CPU s, each request's latency s)."""
    before = cpu.cpu_seconds(proc.pid)
    started = time.monotonic()
    latencies = []
    for i in range(requests):
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"poll {i}"}],
                "max_tokens": 8, "temperature": 0.7, "logprobs": True}
        sent = time.monotonic()
        status, _ = procs.http_post_json(proc.url + "/v1/chat/completions", body)
        latencies.append(time.monotonic() - sent)
        assert status == 200, status
        time.sleep(gap)
    return time.monotonic() - started, cpu.cpu_seconds(proc.pid) - before, latencies


def one_replica(f: procs.Fleet, tmp: Path, busy_loop: float, gaps: list[float],
                requests: int) -> list[str]:
    """A fresh replica with `GRM_CPU_WORKER_BUSY_LOOP_S=busy_loop`: one table row per gap."""
    port = procs.free_port()
    argv = servers.replica_argv(servers.tiny_model(), port, tmp / f"work-{port}",
                                ["--enforce-eager"])
    proc = f.spawn(f"poll-{busy_loop:g}", argv, f"http://127.0.0.1:{port}",
                   env={"GRM_CACHE_DIR": str(tmp / "cache"), "VLLM_CPU_OMP_THREADS_BIND": "0",
                        "GRM_CPU_WORKER_BUSY_LOOP_S": str(busy_loop)})
    try:
        procs.wait_ready(proc, "/health", timeout=600)
        one_gap(proc, 0.0, 3)  # warm-up
        rows = []
        for gap in gaps:
            wall, used, latencies = one_gap(proc, gap, requests)
            rows.append(f"| {busy_loop:g} | {gap:g} | {wall:.1f} | {used:.1f} | "
                        f"{used / requests:.2f} | {used / wall:.2f} | "
                        f"{statistics.median(latencies) * 1e3:.0f} | "
                        f"{max(latencies) * 1e3:.0f} |")
        return rows
    finally:
        proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--gaps", type=float, nargs="+", default=[0.0, 0.25, 2.0])
    parser.add_argument("--busy-loops", type=float, nargs="+", default=[1.0, 0.05],
                        help="values of GRM_CPU_WORKER_BUSY_LOOP_S, one replica each, in turn "
                        "(1: vLLM's own)")
    args = parser.parse_args()
    rows = []
    with procs.fleet() as f, tempfile.TemporaryDirectory(prefix="grm-poll-") as tmp:
        for busy_loop in args.busy_loops:
            rows += one_replica(f, Path(tmp), busy_loop, args.gaps, args.requests)
    print(f"{args.requests} requests one at a time, 8 tokens with logprobs")
    print("| worker busy loop s | gap s | wall s | replica CPU s | CPU s per request | "
          "CPU s per wall s | latency ms, median | latency ms, max |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
