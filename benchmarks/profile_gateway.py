"""Where the gateway spends its time: py-spy samples grm-service under wrk load (default c=64).

Starts the stubs and grm-service (attach mode), drives the gateway with wrk, records the gateway
with py-spy (collapsed stacks, idle frames dropped) and prints: throughput during the profile, the
share of samples by library (inclusive: a sample counts for every library on its stack) and the
top functions by self time. The raw stacks go to benchmarks/results/<out>.txt (default
profile-c<C>), the summary to <out>.summary.txt, a flamegraph (--flamegraph) to <out>.svg.

    .venv/bin/python benchmarks/profile_gateway.py [--concurrency 64] [--seconds 15]

`--workers N` runs `serve --workers N` and records its busiest worker (the most CPU in the
second before); `--fast-stubs` the stubs of `stub_server.py --fast`.

`--native` records C frames too (py-spy --native; the process is paused for each sample, so
its req/s drops) and keeps the event loop's thread only, its idle waits dropped: then the shares
show the system calls (`write`, `read`) and the C libraries (uvloop, httptools, msgspec) beside
the Python functions, and an inclusive table lists the functions that hold the most samples.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import threading
import time
from pathlib import Path

from harness import bodies, cpu, loadgen, procs, servers
from harness.procs import RESULTS

PY_SPY = procs.PEERS_BIN / "py-spy"

# First match wins; ordered from the most specific.
BUCKETS = [
    ("grm_service.fingerprint / blake3", r"grm_service/fingerprint\.py|blake3"),
    ("grm_service.gateway.request.router (canonical json, crc32)",
     r"grm_service/gateway/request/router\.py|grm_service/canonical\.py|grm_service/checksum\.py"),
    # forward and the modules it runs through per request (context, attempt, serialization).
    ("grm_service.gateway.request.proxy",
     r"grm_service/gateway/request/(proxy|context|exchange|alone)\.py"),
    ("grm_service.gateway.request.upstream (the replica hop)",
     r"grm_service/gateway/request/upstream\.py"),
    ("grm_service.ledger", r"grm_service/ledger/"),
    ("grm_service.gateway.edge (routes, middleware, guards)", r"grm_service/gateway/edge/"),
    ("pydantic (validate, model_dump)", r"pydantic"),
    ("prometheus_client and the tally", r"prometheus_client|grm_service/tally\.py"),
    ("grm_service.worker_side.shared_gate (with --workers)",
     r"grm_service/worker_side/(shared_gate|gates|counts|wakeups)\.py"),
    ("json (stdlib)", r"/json/"),
    ("httpcore pool scan (_assign_requests_to_connections)", r"_assign_requests_to_connections"),
    ("anyio threadpool hop (sync dependency)", r"run_in_threadpool|to_thread|run_sync"),
    ("aiohttp client", r"aiohttp/"),
    ("httpx client", r"httpx/"),
    ("httpcore (connection pool, h11)", r"httpcore/|/h11/"),
    ("anyio", r"anyio/"),
    ("fastapi", r"fastapi/"),
    ("starlette", r"starlette/"),
    ("uvicorn (httptools server)", r"uvicorn/"),
    ("asyncio / uvloop event loop", r"asyncio/|uvloop"),
]


# The event loop's thread (the stacks through the server's entry point), and its idle waits.
_LOOP_THREAD = "run_server (grm_service/gateway/serve.py"
_IDLE_LEAF = re.compile(r"^epoll_p?wait \(")


def _record(pid: int, seconds: int, out: Path, native: bool = False) -> None:
    # py-spy reads C stacks only from a stopped process: --native cannot be --nonblocking.
    mode = ["--native"] if native else ["--nonblocking"]
    argv = [str(PY_SPY), "record", "-p", str(pid), "-d", str(seconds), "-r", "200",
            "-f", "raw", "-o", str(out), *mode]
    subprocess.run(argv, check=True, capture_output=True)


def _flame(raw: Path, svg: Path, pid: int, seconds: int) -> None:
    argv = [str(PY_SPY), "record", "-p", str(pid), "-d", str(seconds), "-r", "200",
            "-f", "flamegraph", "-o", str(svg), "--nonblocking"]
    subprocess.run(argv, check=True, capture_output=True)


def _stacks(raw: Path, native: bool) -> list[tuple[list[str], int]]:
    stacks: list[tuple[list[str], int]] = []
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            frames = stack.split(";")
            if native and (not any(_LOOP_THREAD in f for f in frames)
                           or _IDLE_LEAF.match(frames[-1])):
                continue
            stacks.append((frames, int(count)))
    return stacks


def _by_function(stacks: list[tuple[list[str], int]], top: int) -> list[str]:
    """The functions that hold the most samples, their callees included (line numbers dropped,
    the frames every sample shares left out)."""
    total = sum(c for _, c in stacks) or 1
    held: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        for name in {re.sub(r":\d+\)$", ")", f) for f in frames}:
            held[name] += count
    shown = [(fn, c) for fn, c in held.most_common() if c < total][:top]
    return [f"{fn[:88]:<88} {c / total:>6.1%}" for fn, c in shown]


def summarize(*raws: Path, top: int = 25, native: bool = False) -> str:
    stacks = [stack for raw in raws for stack in _stacks(raw, native)]
    total = sum(c for _, c in stacks) or 1
    inclusive: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        seen = {name for name, pattern in BUCKETS for f in frames if re.search(pattern, f)}
        for name in seen:
            inclusive[name] += count
        leaf[frames[-1]] += count
    where = "the event loop's thread, busy" if native else "busy only"
    lines = [f"{total} samples ({where})", "", f"{'library (inclusive)':<56} {'share':>6}"]
    lines += [f"{name:<56} {inclusive[name] / total:>6.1%}" for name, _ in BUCKETS]
    lines += ["", f"{'function (self)':<88} {'share':>6}"]
    lines += [f"{fn[:88]:<88} {c / total:>6.1%}" for fn, c in leaf.most_common(top)]
    if native:
        lines += ["", f"{'function (inclusive), the event loop thread':<88} {'share':>6}"]
        lines += _by_function(stacks, 2 * top)
    return "\n".join(lines)


def _busiest(pid: int) -> int:
    """The descendant of `pid` that used the most CPU in the next second (a busy worker)."""
    pids = cpu.descendants(pid)
    before = {p: cpu.cpu_seconds(p) for p in pids}
    time.sleep(1.0)
    return max(pids, key=lambda p: cpu.cpu_seconds(p) - before[p])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--src", type=Path, default=None,
                        help="folder with a patched grm_service package to profile instead")
    parser.add_argument("--out", default=None, help="file name stem under results/")
    parser.add_argument("--flamegraph", action="store_true", help="also record an SVG (2nd run)")
    parser.add_argument("--native", action="store_true",
                        help="C frames too (system calls, uvloop, httptools); the loop's thread")
    parser.add_argument("--workers", type=int, default=1, help="serve --workers N")
    parser.add_argument("--fast-stubs", action="store_true")
    parser.add_argument("--body", choices=bodies.KINDS, default="short",
                        help="which requests (harness/bodies.py)")
    parser.add_argument("--summarize", type=Path, nargs="+", default=None, metavar="RAW",
                        help="only print the tables of recorded files (py-spy -f raw)")
    args = parser.parse_args()
    if args.summarize is not None:
        print(summarize(*args.summarize, native=args.native))
        return
    RESULTS.mkdir(exist_ok=True)
    raw = RESULTS / f"{args.out or f'profile-c{args.concurrency}'}.txt"
    with procs.fleet() as f:
        stubs = [servers.start_stub(f, i, fast=args.fast_stubs) for i in range(args.replicas)]
        extra = ["--workers", str(args.workers)] if args.workers > 1 else []
        grm = servers.start_grm(f, [s.url for s in stubs], src=args.src, extra=extra)
        load = loadgen.Load(args.concurrency, args.seconds + 4, body=args.body)
        loadgen.run_split([grm.url], loadgen.Load(args.concurrency, 2, body=args.body))
        result: list[loadgen.Result] = []
        thread = threading.Thread(target=lambda: result.append(loadgen.run_split([grm.url], load)))
        thread.start()
        target = _busiest(grm.pid) if args.workers > 1 else grm.pid
        _record(target, args.seconds, raw, args.native)
        thread.join()
        if args.flamegraph:
            thread = threading.Thread(target=lambda: loadgen.run_split([grm.url], load))
            thread.start()
            _flame(raw, raw.with_suffix(".svg"), grm.pid, args.seconds)
            thread.join()
    res = result[0]
    print(f"grm-service at c={args.concurrency}: {res.rps:.0f} req/s, p50 {res.pct_ms(50):.2f} ms,"
          f" p99 {res.pct_ms(99):.2f} ms, errors {res.errors}\n")
    table = summarize(raw, native=args.native)
    raw.with_suffix(".summary.txt").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
