"""Bounded closed-loop load on loopback with wrk (C, one thread per 256 connections).

Each run is limited in time (`-d`) and in count (a per-thread request budget in loadgen.lua).
`run_split` drives several targets at once (one wrk each, connections split evenly) and merges
them, which is how the "direct" floor hits every stub replica. wrk's own CPU is counted from
this process's reaped children.
"""

from __future__ import annotations

import bisect
import json
import resource
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import bodies

LUA = Path(__file__).with_name("loadgen.lua")
PATH = "/v1/chat/completions"


@dataclass
class Load:
    connections: int
    duration_s: float
    keys: int = 256
    max_requests: int = 2_000_000
    model: str = "rm"
    pin: str = ""
    body: str = "short"  # which requests (bodies.py): short, judge or sdk


@dataclass
class Result:
    requests: int
    duration_s: float
    errors: int
    quantiles_us: list[tuple[float, float]]  # (percentile, latency in microseconds)
    loadgen_cpu_s: float

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0

    def pct_ms(self, p: float) -> float:
        """Latency at percentile p (ms), interpolated between the stored percentiles."""
        ps = [q for q, _ in self.quantiles_us]
        i = bisect.bisect_left(ps, p)
        if i < len(ps) and ps[i] == p:
            return self.quantiles_us[i][1] / 1000
        lo, hi = self.quantiles_us[max(i - 1, 0)], self.quantiles_us[min(i, len(ps) - 1)]
        if hi[0] == lo[0]:
            return lo[1] / 1000
        return (lo[1] + (hi[1] - lo[1]) * (p - lo[0]) / (hi[0] - lo[0])) / 1000


def _argv(url: str, load: Load, connections: int, file: Path | None) -> list[str]:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("wrk not found: apt-get install wrk")
    threads = max(1, min(connections // 256 + 1, 2, connections))
    budget = max(1, load.max_requests // threads)
    seconds = max(1, round(load.duration_s))  # wrk takes whole seconds
    return [wrk, "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s",
            "--timeout", "30s", "-s", str(LUA), url, "--",
            str(load.keys), str(budget), load.model, PATH, load.pin, str(file or "")]


def _parse(out: str) -> dict[str, object]:
    for line in out.splitlines():
        if line.startswith("JSON "):
            return dict(json.loads(line[5:]))
    raise RuntimeError(f"wrk printed no result:\n{out[-2000:]}")


def run_split(urls: list[str], load: Load) -> Result:
    """One wrk per url, `load.connections` split evenly over them (urls beyond it stay idle)."""
    n = min(len(urls), load.connections)
    share = [load.connections // n + (1 if i < load.connections % n else 0) for i in range(n)]
    file = bodies.write(load.body, load.model) if load.body != "short" else None
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        procs = [subprocess.Popen(_argv(u, load, c, file), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
                 for u, c in zip(urls[:n], share, strict=True)]
        outs = [p.communicate(timeout=load.duration_s + 60)[0] for p in procs]
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        if file is not None:
            file.unlink()
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return _merge([_parse(o) for o in outs], cpu)


def _merge(parts: list[dict[str, object]], cpu: float) -> Result:
    requests = sum(int(p["requests"]) for p in parts)  # type: ignore[call-overload]
    duration = max(int(p["duration_us"]) for p in parts) / 1e6  # type: ignore[call-overload]
    errors = sum(sum(p["errors"].values()) for p in parts)  # type: ignore[attr-defined]
    tables = [[(float(a), float(b)) for a, b in p["quantiles_us"]]  # type: ignore[attr-defined]
              for p in parts]
    weights = [int(p["requests"]) or 1 for p in parts]  # type: ignore[call-overload]
    return Result(requests, duration, errors, _mixture(tables, weights), cpu)


Table = list[tuple[float, float]]


def _mixture(tables: list[Table], weights: list[int]) -> Table:
    """Quantiles of the request-weighted mixture of several latency distributions."""
    if len(tables) == 1:
        return tables[0]
    total = sum(weights)

    def cdf(x: float) -> float:
        acc = 0.0
        for table, w in zip(tables, weights, strict=True):
            acc += w * _cdf_at(table, x)
        return acc / total * 100

    out = []
    for p, _ in tables[0]:
        lo, hi = 0.0, max(t[-1][1] for t in tables)
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
        out.append((p, hi))
    return out


def _cdf_at(table: list[tuple[float, float]], x: float) -> float:
    """Fraction (0-1) of one distribution at or below x, linear between stored quantiles."""
    prev_p, prev_v = 0.0, 0.0
    for p, v in table:
        if x < v:
            span = v - prev_v
            return (prev_p + (p - prev_p) * ((x - prev_v) / span if span else 1.0)) / 100
        prev_p, prev_v = p, v
    return 1.0
