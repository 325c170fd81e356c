"""Gateway overhead on STUB backends: grm-service vs vllm-router vs smg vs direct, same stubs.

Starts R stub replicas and every contender in front of them, then, for each round, each
concurrency and each contender (in `rounds.order`, so slow drifts of a shared machine hit all
contenders alike), runs a short warm-up and a bounded wrk run. Records req/s, latency
percentiles, and CPU seconds per request of the contender process, the stubs and wrk.

    .venv/bin/python benchmarks/bench_gateway.py                # ~6 min, prints the table
    .venv/bin/python benchmarks/bench_gateway.py --variant fix=/tmp/grm-fix  # + a patched copy
    .venv/bin/python benchmarks/bench_gateway.py --gateway-workers 1 2  # serve --workers 1, 2
    .venv/bin/python benchmarks/bench_gateway.py --contenders grm-service grm-service-noledger \
        --concurrency 64 --out ledger-cost            # what recording every answer costs
    .venv/bin/python benchmarks/bench_gateway.py --contenders direct --gateway-workers 1 4 \
        --replicas 1 --stub-delay 0.1 --concurrency 512   # below saturation: waits in the gate
    .venv/bin/python benchmarks/bench_gateway.py --body judge --concurrency 64  # a judge request
    .venv/bin/python benchmarks/bench_gateway.py --body sdk --concurrency 64   # the OpenAI SDK's

`--body` picks the requests (benchmarks/harness/bodies.py): `short`, the 120-byte body; `judge`, a
~1.1 KB four-message judge request with sampling fields; `sdk`, what the OpenAI Python SDK
sends (its compact body, its headers).

Writes benchmarks/results/gateway.json (every run) and gateway.md (the summary tables).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness import bodies, cpu, loadgen, procs, rounds, servers
from harness.procs import RESULTS

PEERS = ("vllm-router", "smg")


@dataclass
class Run:
    round: int
    concurrency: int
    contender: str
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int
    requests: int
    proxy_cpu_us: float  # contender process CPU per request (0 for direct)
    stub_cpu_us: float
    wrk_cpu_us: float
    proxy_sys_us: float = 0.0  # the kernel's part of proxy_cpu_us (0 in runs before it was kept)
    # Each serving process's share of the contender's CPU, largest first (`serve --workers N`:
    # how evenly the workers' accepts spread the connections); empty in runs before it was kept.
    shares: list[float] = field(default_factory=list)


@dataclass
class Contender:
    name: str
    urls: list[str]
    procs: list[procs.Proc]  # none: direct to the stubs

    def user_system(self) -> tuple[float, float]:
        """CPU seconds, and their kernel part (one pass over /proc per process)."""
        splits = [p.user_system() for p in self.procs]
        system = sum(s for _, s in splits)
        return sum(u for u, _ in splits) + system, system

    def per_process(self) -> dict[int, float]:
        """CPU seconds of each of the contender's processes and of their descendants, one
        by one (a manager, its keeper and each worker apart)."""
        return {pid: cpu.cpu_seconds(pid, alone=True)
                for p in self.procs for pid in [p.pid, *cpu.descendants(p.pid)]}


def _shares(before: dict[int, float], after: dict[int, float]) -> list[float]:
    """Each process's share of the CPU between the two snapshots, in %, largest first; those
    under 2 % (a manager, a keeper) left out."""
    used = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    total = sum(used.values())
    if total <= 0:
        return []
    return sorted((round(100 * u / total, 1) for u in used.values() if u / total >= 0.02),
                  reverse=True)


def _start(f: procs.Fleet, name: str, backends: list[str], variants: dict[str, Path],
           env_variants: dict[str, tuple[str, str]]) -> Contender:
    starters: dict[str, Callable[[], procs.Proc]] = {
        "grm-service": lambda: servers.start_grm(f, backends),
        # The same, its ledger off: recording's cost, measured in the same run.
        "grm-service-noledger": lambda: servers.start_grm(f, backends, "grm-service-noledger",
                                                        env_extra={"GRM_LEDGER": "false"}),
        "vllm-router": lambda: servers.start_vllm_router(f, backends),
        # The floor: the same deterministic work in Python, nothing else (lean_proxy.py).
        "lean-proxy": lambda: servers.start_lean(f, backends),
        "smg": lambda: servers.start_smg(f, backends),
    }
    for vname, src in variants.items():
        starters[vname] = lambda vname=vname, src=src: servers.start_grm(f, backends, vname, src)
    for vname, (var, value) in env_variants.items():
        starters[vname] = lambda vname=vname, var=var, value=value: servers.start_grm(
            f, backends, vname, env_extra={var: value})
    proc = starters[name]()
    return Contender(name, [proc.url], [proc])


def _start_workers(f: procs.Fleet, n: int, backends: list[str]) -> Contender:
    """N independent gateways on the same stubs, load split over them: what N processes give
    (an upper bound: each has its own replica gates, not one shared set)."""
    started = [servers.start_grm(f, backends, f"grm-service-x{n}-{i}") for i in range(n)]
    return Contender(f"grm-service-x{n}", [p.url for p in started], started)


def _start_gateway_workers(f: procs.Fleet, n: int, backends: list[str],
                           src: Path | None, tag: str = "",
                           env: dict[str, str] | None = None) -> Contender:
    """`serve --workers N`: one port, one replica set; CPU counts every worker (descendants).
    `src`: a folder holding another `grm_service` to run instead of the checkout's; `env`
    one more variable, the contender then named `grm-service-wN-TAG`."""
    name = f"grm-service-w{n}" + (f"-{tag}" if tag else "")
    proc = servers.start_grm(f, backends, name, src, extra=["--workers", str(n)], env_extra=env)
    return Contender(name, [proc.url], [proc])


def _measure(c: Contender, stubs: list[procs.Proc], load: loadgen.Load, rnd: int) -> Run:
    proxy0, sys0 = c.user_system()
    each0 = c.per_process()
    stub0 = sum(s.cpu() for s in stubs)
    res = loadgen.run_split(c.urls, load)
    n = max(res.requests, 1)
    proxy1, sys1 = c.user_system()
    shares = _shares(each0, c.per_process())
    proxy, system = proxy1 - proxy0, sys1 - sys0
    stub = sum(s.cpu() for s in stubs) - stub0
    return Run(rnd, load.connections, c.name, res.rps, res.pct_ms(50), res.pct_ms(90),
               res.pct_ms(99), res.errors, res.requests, proxy / n * 1e6, stub / n * 1e6,
               res.loadgen_cpu_s / n * 1e6, system / n * 1e6, shares)


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _cell(rs: list[Run], key: str, fmt: str) -> str:
    """Median over the runs that completed a request (a stalled run has no latencies)."""
    vals = [getattr(r, key) for r in rs if r.requests > 0]
    return format(_med(vals), fmt) if vals else "n/a"


def summarize(runs: list[Run], contenders: list[str]) -> str:
    out = []
    for c in sorted({r.concurrency for r in runs}):
        at = {name: [r for r in runs if r.concurrency == c and r.contender == name]
              for name in contenders}
        rps = {name: _med([r.rps for r in rs]) for name, rs in at.items() if rs}
        p50 = {name: _med([r.p50_ms for r in rs if r.requests > 0])
               for name, rs in at.items() if any(r.requests > 0 for r in rs)}
        peers = [p for p in PEERS if p in rps]
        best = max(peers, key=lambda p: rps[p]) if peers else None
        out += [f"\n### concurrency {c}  (best peer: {best or 'none'})\n",
                "| contender | req/s median [min-max] | p50 ms | p90 ms | p99 ms | x direct "
                "| x best peer | p50 added ms | proxy CPU us/req | of it system | stub CPU us/req "
                "| errors |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, rs in at.items():
            if not rs:
                continue
            vs_direct = rps[name] / rps["direct"] if "direct" in rps else float("nan")
            vs_peer = rps[name] / rps[best] if best else float("nan")
            added = (f"{p50[name] - p50['direct']:+.3f}"
                     if name in p50 and "direct" in p50 else "n/a")
            out.append(
                f"| {name} | {rounds.spread([r.rps for r in rs], '.0f')} "
                f"| {_cell(rs, 'p50_ms', '.3f')} "
                f"| {_cell(rs, 'p90_ms', '.3f')} | {_cell(rs, 'p99_ms', '.3f')} "
                f"| {vs_direct:.2f} | {vs_peer:.2f} | {added} "
                f"| {_cell(rs, 'proxy_cpu_us', '.0f')} | {_cell(rs, 'proxy_sys_us', '.0f')} "
                f"| {_cell(rs, 'stub_cpu_us', '.0f')} "
                f"| {sum(r.errors for r in rs)} |")
    return "\n".join(out)


def paired(runs: list[Run], ref: str) -> str:
    """Each contender against `ref` within each round (the two ran back to back): the ratio of
    req/s and the difference of proxy CPU, median [min-max] over the rounds. Steadier than a
    ratio of medians on a machine whose pace drifts between rounds."""
    out = [f"\n### paired with {ref}, per round\n",
           f"| c | contender | req/s / {ref}'s | proxy CPU - {ref}'s, us/req |",
           "|---|---|---|---|"]
    for c in sorted({r.concurrency for r in runs}):
        base = {r.round: r for r in runs if r.concurrency == c and r.contender == ref}
        names = dict.fromkeys(r.contender for r in runs if r.contender != ref)
        for name in names:
            pairs = [(r, base[r.round]) for r in runs if r.concurrency == c
                     and r.contender == name and r.round in base and base[r.round].rps > 0]
            if not pairs:
                continue
            ratio = [a.rps / b.rps for a, b in pairs]
            more = [a.proxy_cpu_us - b.proxy_cpu_us for a, b in pairs]
            out.append(f"| {c} | {name} | {rounds.spread(ratio, '.3f')} "
                       f"| {_med(more):+.0f} [{min(more):+.0f} to {max(more):+.0f}] |")
    return "\n".join(out)


def resummarize(path: Path) -> None:
    data = json.loads(path.read_text())
    runs = [Run(**r) for r in data["runs"]]
    names = list(dict.fromkeys(r.contender for r in runs))
    table = summarize(runs, names)
    path.with_suffix(".md").write_text(table + "\n")
    print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--stub-delay", type=float, default=0.0, metavar="S",
                        help="each stub answers after S seconds: a replica the gateway does not "
                        "saturate (with c above GRM_MAX_INFLIGHT_PER_REPLICA, requests wait in "
                        "its gate)")
    parser.add_argument("--fast-stubs", action="store_true",
                        help="stubs that answer the engine routes in their protocol "
                        "(stub_server.py --fast): the stubs' CPU no longer competes with "
                        "many gateway workers for the machine's cores")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--body", choices=bodies.KINDS, default="short",
                        help="the requests sent (bodies.py): the short body, a judge "
                        "request, or the OpenAI SDK's")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measured run")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before each run")
    parser.add_argument("--max-requests", type=int, default=500_000, help="per run")
    parser.add_argument("--contenders", nargs="*",
                        default=["direct", "grm-service", "vllm-router", "smg"])
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                        help="also run grm-service imported from DIR/grm_service")
    parser.add_argument("--env-variant", action="append", default=[], metavar="NAME=VAR=VALUE",
                        help="also run the checkout's grm-service with one more env var (an "
                        "A/A pair: a second grm-service-noledger as aa=GRM_LEDGER=false)")
    parser.add_argument("--workers", type=int, nargs="*", default=[], metavar="N",
                        help="also run N independent grm-service processes, load split")
    parser.add_argument("--gateway-workers", type=int, nargs="*", default=[], metavar="N",
                        help="also run grm-service with --workers N (contender grm-service-wN)")
    parser.add_argument("--gateway-workers-src", action="append", default=[],
                        metavar="TAG=DIR", help="also run every --gateway-workers N from "
                        "DIR/grm_service (contender grm-service-wN-TAG): before and after in "
                        "the same rounds")
    parser.add_argument("--gateway-workers-env", action="append", default=[],
                        metavar="TAG=VAR=VALUE", help="also run every --gateway-workers N with "
                        "one more env var (contender grm-service-wN-TAG)")
    parser.add_argument("--pair-with", default=None, metavar="NAME",
                        help="also compare every contender with NAME round by round")
    parser.add_argument("--workers-src", type=Path, default=None, metavar="DIR",
                        help="run --gateway-workers from DIR/grm_service (an older tree)")
    parser.add_argument("--out", default="gateway")
    parser.add_argument("--resummarize", type=Path, default=None, metavar="JSON",
                        help="only rebuild the tables of an earlier run's JSON")
    args = parser.parse_args()
    if args.resummarize:
        resummarize(args.resummarize)
        return
    variants = {k: Path(v) for k, v in (s.split("=", 1) for s in args.variant)}
    env_variants = {name: (var, value) for name, var, value
                    in (spec.split("=", 2) for spec in args.env_variant)}
    gw_env = [tuple(spec.split("=", 2)) for spec in args.gateway_workers_env]
    gw_src = [(tag, Path(src)) for tag, src in
              (spec.split("=", 1) for spec in args.gateway_workers_src)]
    names = [*args.contenders, *variants, *env_variants]
    runs: list[Run] = []
    failed: dict[str, str] = {}
    started = time.time()
    with procs.fleet() as f:
        stubs = [servers.start_stub(f, i, args.stub_delay, args.fast_stubs)
                 for i in range(args.replicas)]
        backends = [s.url for s in stubs]
        contenders = [Contender("direct", backends, [])] if "direct" in names else []
        for name in names:
            if name == "direct":
                continue
            try:
                contenders.append(_start(f, name, backends, variants, env_variants))
            except (RuntimeError, OSError) as err:
                failed[name] = str(err)[-1500:]
                print(f"!! {name} did not start: {failed[name]}", file=sys.stderr)
        for n in args.workers:
            contenders.append(_start_workers(f, n, backends))
        for n in args.gateway_workers:
            contenders.append(_start_gateway_workers(f, n, backends, args.workers_src))
            for tag, var, value in gw_env:
                contenders.append(_start_gateway_workers(f, n, backends, args.workers_src, tag,
                                                         {var: value}))
            for tag, src in gw_src:
                contenders.append(_start_gateway_workers(f, n, backends, src, tag))
        for rnd in range(args.rounds):
            for conc in args.concurrency:
                for c in rounds.order(contenders, rnd):
                    loadgen.run_split(c.urls, loadgen.Load(conc, args.warmup, body=args.body))
                    load = loadgen.Load(conc, args.duration, max_requests=args.max_requests,
                                        body=args.body)
                    run = _measure(c, stubs, load, rnd)
                    runs.append(run)
                    print(f"round {rnd} c={conc:<4} {c.name:<14} {run.rps:>8.0f} req/s "
                          f"p50 {run.p50_ms:8.3f} p99 {run.p99_ms:9.3f} ms  "
                          f"proxy {run.proxy_cpu_us:6.0f} us/req  err {run.errors}"
                          + (f"  shares % {run.shares}" if len(run.shares) > 1 else ""),
                          flush=True)
    present = ([c for c in names if c not in failed] + [f"grm-service-x{n}" for n in args.workers]
               + [f"grm-service-w{n}{suffix}" for n in args.gateway_workers
                  for suffix in ["", *(f"-{tag}" for tag, _, _ in gw_env),
                                 *(f"-{tag}" for tag, _ in gw_src)]])
    table = summarize(runs, present)
    if args.pair_with:
        table += "\n" + paired(runs, args.pair_with)
    meta = {"machine": f"{platform.node()} {platform.processor() or platform.machine()}, "
                       f"{os.cpu_count()} CPUs",
            "replicas": args.replicas, "stub_delay_s": args.stub_delay,
            "fast_stubs": args.fast_stubs, "rounds": args.rounds,
            "duration_s": args.duration, "body": args.body,
            "wall_s": round(time.time() - started), "failed": failed,
            "argv": " ".join(sys.argv)}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(
        json.dumps({"meta": meta, "runs": [asdict(r) for r in runs]}, indent=1))
    (RESULTS / f"{args.out}.md").write_text(table + "\n")
    print(table)
    for name, err in failed.items():
        print(f"\n{name} FAILED TO START:\n{err}")



if __name__ == "__main__":
    main()
