"""What a CPU replica costs between requests: vLLM's engine core and worker busy-poll their
shared-memory queue for a while after each message, so a replica that gets requests spaced
apart burns CPU while it waits.

Starts one `grm-service backend` on the tiny text model with the test suite's flags, then sends
the same requests (8 tokens, logprobs) one at a time with a pause of each `--gaps` value between
them, and prints per gap: the wall time, the replica's CPU (its whole process tree) and that CPU
per second of wall.

    .venv/bin/python benchmarks/engine_poll.py [--requests 20] [--gaps 0 0.25 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs
from replica_start import FLAGS

from grm_service.tiny_models import ensure_tiny_model


def one_gap(proc: procs.Proc, gap: float, requests: int) -> tuple[float, float, list[float]]:
    """(wall s, the replica's CPU s, each request's latency s)."""
    cpu = procs.cpu_seconds(proc.pid)
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
    return time.monotonic() - started, procs.cpu_seconds(proc.pid) - cpu, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--gaps", type=float, nargs="+", default=[0.0, 0.25, 2.0])
    args = parser.parse_args()
    model = ensure_tiny_model("text")
    rows = []
    with procs.fleet() as f, tempfile.TemporaryDirectory(prefix="grm-poll-") as tmp:
        port = procs.free_port()
        argv = [str(procs.MAIN_PY), "-m", "grm_service.cli", "backend", "--model", str(model),
                "--port", str(port), *FLAGS, "--work-dir", str(Path(tmp) / "work"), "--",
                "--enforce-eager"]
        proc = f.spawn("poll", argv, f"http://127.0.0.1:{port}",
                       env={"GRM_CACHE_DIR": str(Path(tmp) / "cache"),
                            "VLLM_CPU_OMP_THREADS_BIND": "0"})
        procs.wait_ready(proc, "/health", timeout=600)
        one_gap(proc, 0.0, 3)  # warm-up
        for gap in args.gaps:
            wall, cpu, latencies = one_gap(proc, gap, args.requests)
            rows.append(f"| {gap:g} | {wall:.1f} | {cpu:.1f} | {cpu / args.requests:.2f} | "
                        f"{cpu / wall:.2f} | {statistics.median(latencies) * 1e3:.0f} | "
                        f"{max(latencies) * 1e3:.0f} |")
    print(f"{args.requests} requests one at a time, 8 tokens with logprobs")
    print("| gap s | wall s | replica CPU s | CPU s per request | CPU s per wall s | "
          "latency ms, median | latency ms, max |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
