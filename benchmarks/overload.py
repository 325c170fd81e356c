"""Overload: far more concurrent clients than the gateway admits, in front of SLOW STUB backends.

The backends are the project's STUB app (no model; `--delay` seconds per request, so each slot is
held long enough for the queue to fill). The gateway is configured with small limits through its
env vars (GRM_MAX_INFLIGHT_PER_REPLICA, GRM_MAX_QUEUE, GRM_QUEUE_TIMEOUT_S) and `--serialize off`
(a stub is not an engine whose batching could change bits, and serializing would hide the
per-replica limit). What must hold: every answer is 200 or 429 (429 with Retry-After), accepted
requests keep a bounded latency, and the gateway's memory comes back down after the burst.

    .venv/bin/python benchmarks/overload.py [--requests 5000] [--concurrency 256] [--runs 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
import uvloop
from harness import cpu, procs, servers


@dataclass
class Outcome:
    statuses: Counter[int] = field(default_factory=Counter)
    accepted_s: list[float] = field(default_factory=list)
    no_retry_after: int = 0  # 429s without a Retry-After header
    transport_errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0


class RssSampler:
    """VmRSS of one process, read from /proc every `period_s` on a thread (peak between reads
    is missed, so the period is short next to the burst)."""

    def __init__(self, pid: int, period_s: float = 0.02) -> None:
        self.pid = pid
        self.period_s = period_s
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def read_kib(self) -> int:
        return cpu.rss_kib(self.pid)

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.peak_kib = max(self.peak_kib, self.read_kib())

    def __enter__(self) -> RssSampler:
        self.peak_kib = self.read_kib()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def body(i: int, keys: int) -> dict[str, object]:
    return {"model": procs.STUB_MODEL, "max_tokens": 8, "seed": 42,
            "messages": [{"role": "user", "content": f"overload prompt {i % keys}"}]}


async def _one(session: aiohttp.ClientSession, url: str, i: int, keys: int,
               out: Outcome) -> None:
    start = time.perf_counter()
    try:
        async with session.post(url, json=body(i, keys)) as r:
            await r.read()
            status, retry_after = r.status, r.headers.get("retry-after")
    except aiohttp.ClientError as err:
        out.statuses[0] += 1  # no HTTP answer at all: counted as "other", a failure
        out.transport_errors.append(repr(err))
        return
    out.statuses[status] += 1
    if status == 200:
        out.accepted_s.append(time.perf_counter() - start)
    elif status == 429 and retry_after is None:
        out.no_retry_after += 1


async def drive(base: str, requests: int, concurrency: int, keys: int = 256) -> Outcome:
    """`concurrency` workers share one counter: a closed loop, as many clients retrying at once.
    aiohttp, not httpx: at c=256 httpx's pool costs several ms of CPU per request, and the load
    generator shares the CPUs with the gateway it measures."""
    out = Outcome()
    todo = iter(range(requests))
    url = base + "/v1/chat/completions"
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in todo:
            await _one(session, url, i, keys, out)

    start = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    out.wall_s = time.perf_counter() - start
    return out


@dataclass(frozen=True)
class Limits:
    inflight: int
    queue: int
    queue_timeout_s: float

    def env(self) -> dict[str, str]:
        return {"GRM_MAX_INFLIGHT_PER_REPLICA": str(self.inflight),
                "GRM_MAX_QUEUE": str(self.queue), "GRM_QUEUE_TIMEOUT_S": str(self.queue_timeout_s)}


@dataclass
class Row:
    outcome: Outcome
    rss_before_kib: int
    rss_peak_kib: int
    rss_after_kib: int
    gateway_cpu_s: float
    client_cpu_s: float


def one_run(args: argparse.Namespace, limits: Limits) -> Row:
    with procs.fleet() as f:
        stubs = [servers.start_stub(f, i, delay=args.delay) for i in range(args.replicas)]
        # Audits re-run requests on another replica: off, so every backend call is a client's.
        gw = servers.start_grm(f, [s.url for s in stubs], "grm-overload",
                               env_extra={"GRM_AUDIT_FRACTION": "0", **limits.env()})
        uvloop.run(drive(gw.url, 64, 8))  # warm: imports, connection pools, first allocations
        gw_cpu, client_cpu = gw.cpu(), _own_cpu()
        with RssSampler(gw.pid) as rss:
            before = rss.peak_kib
            outcome = uvloop.run(drive(gw.url, args.requests, args.concurrency))
            gw_cpu, client_cpu = gw.cpu() - gw_cpu, _own_cpu() - client_cpu
            time.sleep(args.settle)  # let queued tasks and buffers be released
            after = rss.read_kib()
        return Row(outcome, before, rss.peak_kib, after, gw_cpu, client_cpu)


def _own_cpu() -> float:
    """The load generator shares the CPUs with the gateway: its cost is printed next to it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _pct(values: list[float], p: float) -> float:
    if len(values) < 2:
        return values[0] * 1000 if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1] * 1000


def report(rows: list[Row], args: argparse.Namespace, limits: Limits) -> None:
    head = (f"{'run':>3} {'requests':>8} {'200':>6} {'429':>6} {'other':>6} {'429 no RA':>9} "
            f"{'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'RSS before MiB':>14} "
            f"{'peak MiB':>8} {'after MiB':>9} {'gw CPU s':>8} {'client CPU s':>12}")
    print(head)
    for n, row in enumerate(rows, 1):
        o = row.outcome
        other = sum(c for s, c in o.statuses.items() if s not in (200, 429))
        print(f"{n:>3} {o.statuses.total():>8} {o.statuses[200]:>6} {o.statuses[429]:>6} "
              f"{other:>6} {o.no_retry_after:>9} {o.statuses.total() / o.wall_s:>7.0f} "
              f"{_pct(o.accepted_s, 50):>8.1f} {_pct(o.accepted_s, 99):>8.1f} "
              f"{row.rss_before_kib / 1024:>14.1f} {row.rss_peak_kib / 1024:>8.1f} "
              f"{row.rss_after_kib / 1024:>9.1f} {row.gateway_cpu_s:>8.1f} "
              f"{row.client_cpu_s:>12.1f}")
    others = Counter[int]()
    for row in rows:
        others.update({s: c for s, c in row.outcome.statuses.items() if s not in (200, 429)})
    if others:
        print(f"statuses other than 200/429 (0 = no HTTP answer): {dict(others)}")
    errors = [e for row in rows for e in row.outcome.transport_errors]
    if errors:
        print(f"first transport errors: {errors[:3]}")
    print(f"\n{args.replicas} STUB backends (delay {args.delay} s); gateway "
          + " ".join(f"{k}={v}" for k, v in limits.env().items()) + " --serialize off")
    print(f"load: {args.concurrency} closed-loop aiohttp clients in this process, "
          f"{os.cpu_count()} CPUs shared by all processes")
    print("rerun: .venv/bin/python benchmarks/overload.py " + " ".join(sys.argv[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=2, help="STUB backends")
    parser.add_argument("--delay", type=float, default=0.05, help="STUB seconds per request")
    parser.add_argument("--max-inflight", type=int, default=8)
    parser.add_argument("--max-queue", type=int, default=64)
    parser.add_argument("--queue-timeout", type=float, default=2.0)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before 'after' RSS")
    args = parser.parse_args()
    limits = Limits(args.max_inflight, args.max_queue, args.queue_timeout)
    rows = [one_run(args, limits) for _ in range(args.runs)]
    report(rows, args, limits)
    bad = any(set(r.outcome.statuses) - {200, 429} or r.outcome.no_retry_after for r in rows)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
