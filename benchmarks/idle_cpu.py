"""What a gateway costs doing nothing: CPU per second of `serve --workers N` on idle STUB
replicas (health checks, liveness pings, the keeper, timers), the fixed part of CPU per request
that grows with N and weighs most below saturation.

    .venv/bin/python benchmarks/idle_cpu.py [--workers 1 2 4 8] [--seconds 10]
    .venv/bin/python benchmarks/idle_cpu.py --workers 1 --rounds 6 [--before DIR] \
        [--tree NAME=DIR ...] [--variant NAME=KEY=VALUE ...]

Prints a table: workers, CPU ms per second of the gateway's processes (all workers and the
keeper), and what that adds per request at 1,000 req/s.

With `--before DIR` or `--tree NAME=DIR` (a folder holding another `grm_service`) or
`--variant` (this tree with one more environment variable, e.g.
`nohealth=GRM_HEALTH_INTERVAL_S=1000`), every contender runs
at once and each is measured in turn, `--rounds` times, in `rounds.order`:
one row per contender and worker count, its rounds and their mean. A `/proc` CPU tick is 10 ms,
so one 10 s window reads to 1 ms/s.

`--trickle R`: not idle but lightly loaded, R chat requests a second (one at a time, each with
its own seed) sent to the gateway being measured, as a trainer scoring now and then: then the
figure holds those requests' CPU too, and the contenders compare side by side.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

from harness import procs, rounds, servers


def _contenders(args: argparse.Namespace) -> dict[str, tuple[Path | None, dict[str, str]]]:
    out: dict[str, tuple[Path | None, dict[str, str]]] = {"this tree": (None, {})}
    if args.before is not None:
        out["before"] = (args.before.resolve(), {})
    for spec in args.tree:
        name, _, folder = spec.partition("=")
        if not name or not folder:
            raise SystemExit(f"--tree {spec!r}: NAME=DIR")
        out[name] = (Path(folder).resolve(), {})
    for spec in args.variant:
        name, _, pair = spec.partition("=")
        key, _, value = pair.partition("=")
        if not name or not key:
            raise SystemExit(f"--variant {spec!r}: NAME=KEY=VALUE")
        out[name] = (None, {key: value})
    return out


def _one_at_a_time(f: procs.Fleet, backends: list[str], n: int,
                   args: argparse.Namespace) -> list[str]:
    gw = servers.start_grm(f, backends, f"idle-w{n}", extra=["--workers", str(n)])
    time.sleep(args.settle)
    before = gw.cpu()
    time.sleep(args.seconds)
    per_s = (gw.cpu() - before) / args.seconds
    gw.stop()
    return [f"| {n} | {per_s * 1e3:.1f} | {per_s / 1000 * 1e6:.0f} |"]


def _trickle(url: str, rate: float, seconds: float) -> threading.Thread:
    """`rate` chat requests a second to `url` for `seconds`, in a thread."""

    def run() -> None:
        start, sent = time.monotonic(), 0
        while time.monotonic() < start + seconds:
            body = {"model": procs.STUB_MODEL, "seed": sent, "max_tokens": 8,
                    "messages": [{"role": "user", "content": f"score prompt {sent}"}]}
            procs.http_post_json(url + "/v1/chat/completions", body)
            sent += 1
            time.sleep(max(0.0, start + sent / rate - time.monotonic()))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _side_by_side(f: procs.Fleet, backends: list[str], n: int,
                  args: argparse.Namespace) -> list[str]:
    gws = {name: servers.start_grm(f, backends, f"idle-{name.replace(' ', '-')}-w{n}", src=src,
                                 extra=["--workers", str(n)], env_extra=env)
           for name, (src, env) in _contenders(args).items()}
    time.sleep(args.settle)
    seen: dict[str, list[float]] = {name: [] for name in gws}
    for r in range(args.rounds):
        for name, gw in rounds.order(list(gws.items()), r):
            before = gw.cpu()
            load = _trickle(gw.url, args.trickle, args.seconds) if args.trickle else None
            time.sleep(args.seconds)
            seen[name].append((gw.cpu() - before) / args.seconds * 1e3)
            if load is not None:
                load.join()
    for gw in gws.values():
        gw.stop()
    return [f"| {n} | {name} | {' / '.join(f'{v:.1f}' for v in values)} | "
            f"{sum(values) / len(values):.2f} |" for name, values in seen.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after ready")
    parser.add_argument("--before", type=Path, default=None, metavar="DIR")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                        help="one more contender: the grm_service package in DIR")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--trickle", type=float, default=0.0, metavar="R",
                        help="R requests a second to the gateway measured (side by side only)")
    args = parser.parse_args()
    paired = args.before is not None or bool(args.variant) or bool(args.tree)
    if args.trickle and not paired:
        raise SystemExit("--trickle compares contenders: give --before, --tree or --variant")
    rows = []
    with procs.fleet() as f:
        backends = [servers.start_stub(f, i).url for i in range(args.replicas)]
        for n in args.workers:
            rows += (_side_by_side if paired else _one_at_a_time)(f, backends, n, args)
    if paired:
        what = f"CPU ms/s at {args.trickle:g} req/s" if args.trickle else "idle CPU ms/s"
        print(f"| workers | gateway | {what}, rounds | mean |\n|---|---|---|---|")
    else:
        print("| workers | idle CPU ms/s | us per request at 1,000 req/s |\n|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
