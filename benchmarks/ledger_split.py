"""Where recording's cost goes: one gateway's CPU split by thread, user and kernel time, page
faults and context switches, per request, with the ledger off and on (and patched copies).

bench_gateway.py gives req/s and the process's CPU; this gives what inside the process grew.
Same load (2 STUB replicas, wrk at c = 64), contenders in rotated order each round, medians.

    .venv/bin/python benchmarks/ledger_split.py                       # ~3 min, prints the table
    .venv/bin/python benchmarks/ledger_split.py --variant fix=/tmp/grm-fix --rounds 8
    .venv/bin/python benchmarks/ledger_split.py --env-variant nobodies=GRM_LEDGER_BODIES=none

The event loop's thread is the process's main thread (tid = pid); "other threads" are the ledger's
writer and reader and the executor's. Writes benchmarks/results/ledger-split.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen
import procs

RESULTS = Path(__file__).resolve().parent / "results"
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Counts:
    """One thread's (or a sum of threads') counters from /proc."""

    utime: float = 0.0
    stime: float = 0.0
    minflt: int = 0
    vcsw: int = 0
    ivcsw: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.utime + other.utime, self.stime + other.stime,
                      self.minflt + other.minflt, self.vcsw + other.vcsw, self.ivcsw + other.ivcsw)

    def __sub__(self, other: Counts) -> Counts:
        return Counts(self.utime - other.utime, self.stime - other.stime,
                      self.minflt - other.minflt, self.vcsw - other.vcsw, self.ivcsw - other.ivcsw)


def thread_counts(path: Path) -> Counts:
    """The counters of the thread at `path` (/proc/PID/task/TID)."""
    fields = (path / "stat").read_text().rsplit(")", 1)[1].split()
    status = dict(line.split(":", 1) for line in (path / "status").read_text().splitlines()
                  if ":" in line)
    return Counts(int(fields[11]) / _TICKS, int(fields[12]) / _TICKS, int(fields[7]),
                  int(status["voluntary_ctxt_switches"]),
                  int(status["nonvoluntary_ctxt_switches"]))


def machine_busy() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine: the kernel's own work (writeback of the
    store's pages, softirqs) is in no process's counters."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / _TICKS, idle / _TICKS


def split(pid: int) -> tuple[Counts, Counts]:
    """(the main thread, every other thread) of a live process."""
    main, others = Counts(), Counts()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, KeyError, IndexError, ValueError):
            counts = thread_counts(task)
            if int(task.name) == pid:
                main = counts
            else:
                others = others + counts
    return main, others


@dataclass
class Row:
    round: int
    contender: str
    rps: float
    loop_user_us: float
    loop_sys_us: float
    other_us: float
    minflt: float
    vcsw: float
    ivcsw: float
    stub_us: float
    machine_us: float  # every core's busy time, all processes and the kernel
    idle_us: float


def measure(name: str, gw: procs.Proc, stubs: list[procs.Proc], load: loadgen.Load,
            rnd: int) -> Row:
    main0, other0 = split(gw.pid)
    stub0 = sum(s.cpu() for s in stubs)
    busy0, idle0 = machine_busy()
    res = loadgen.run_split([gw.url], load)
    main1, other1 = split(gw.pid)
    busy1, idle1 = machine_busy()
    n = max(res.requests, 1)
    loop, other = main1 - main0, other1 - other0
    stub = sum(s.cpu() for s in stubs) - stub0
    return Row(rnd, name, res.rps, loop.utime / n * 1e6, loop.stime / n * 1e6,
               (other.utime + other.stime) / n * 1e6, (loop.minflt + other.minflt) / n,
               (loop.vcsw + other.vcsw) / n, (loop.ivcsw + other.ivcsw) / n, stub / n * 1e6,
               (busy1 - busy0) / n * 1e6, (idle1 - idle0) / n * 1e6)


_COLUMNS = ("rps", "loop_user_us", "loop_sys_us", "other_us", "minflt", "vcsw", "ivcsw",
            "stub_us", "machine_us", "idle_us")


def table(rows: list[Row], names: list[str]) -> str:
    head = ("| contender | req/s | loop user us | loop sys us | other threads us | page faults |"
            " vol. switches | invol. switches | stubs us | machine busy us | machine idle us |"
            " paired req/s [95 % interval] |")
    out = [head, "|" + "---|" * 12]
    base = {r.round: r.rps for r in rows if r.contender == names[0]}
    for name in names:
        mine = [r for r in rows if r.contender == name]
        cells = [statistics.median(getattr(r, c) for r in mine) for c in _COLUMNS]
        ratios = [r.rps / base[r.round] for r in mine]
        low, high = interval(ratios)
        shown = [f"{cells[0]:,.0f}"] + [f"{v:.1f}" for v in cells[1:4]]
        shown += [f"{v:.3f}" for v in cells[4:7]] + [f"{v:.1f}" for v in cells[7:]]
        shown.append(f"{statistics.median(ratios):.3f} [{low:.3f}-{high:.3f}]")
        out.append(f"| {name} | " + " | ".join(shown) + " |")
    return "\n".join(out)


def interval(ratios: list[float], draws: int = 2000) -> tuple[float, float]:
    """A 95 % bootstrap interval of the median ratio (seeded: the same rows give the same)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def starters(f: procs.Fleet, backends: list[str],
             args: argparse.Namespace) -> dict[str, Callable[[], procs.Proc]]:
    out: dict[str, Callable[[], procs.Proc]] = {
        "ledger off": lambda: procs.start_grm(f, backends, "split-off",
                                              env_extra={"GRM_LEDGER": "false"}),
        "ledger on": lambda: procs.start_grm(f, backends, "split-on")}
    for spec in args.variant:
        name, src = spec.split("=", 1)
        out[name] = lambda name=name, src=src: procs.start_grm(f, backends, f"split-{name}",
                                                               Path(src))
    for spec in args.env_variant:
        name, var, value = spec.split("=", 2)
        out[name] = lambda name=name, var=var, value=value: procs.start_grm(
            f, backends, f"split-{name}", env_extra={var: value})
    return out


def pin(proc: procs.Proc, cpus: set[int]) -> procs.Proc:
    """Every thread of a running process on `cpus` (threads it starts later inherit it)."""
    for task in Path(f"/proc/{proc.pid}/task").iterdir():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task.name), cpus)
    return proc


_CGROUP = Path("/sys/fs/cgroup/cpu")


def own_group(proc: procs.Proc, name: str) -> procs.Proc:
    """The process (every thread) in a cpu cgroup of its own, equal shares: the kernel shares
    CPU fairly between groups, where between threads a gateway with a writer thread would get
    more than one without. Left as is where cgroup v1's cpu controller is not writable."""
    group = _CGROUP / f"grm-bench-{name.replace(' ', '-')}"
    try:
        group.mkdir(exist_ok=True)
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            (group / "tasks").write_text(task.name)
    except OSError as err:
        print(f"no cgroup for {name} ({err}): shares are per thread", file=sys.stderr)
    return proc


def together(gws: dict[str, procs.Proc], stubs: list[procs.Proc], load: loadgen.Load,
             rnd: int) -> list[Row]:
    """Every gateway under its own wrk at once: the machine's pace, which drifts between runs
    by more than the ledger costs, is the same for all of them."""
    with ThreadPoolExecutor(len(gws)) as pool:
        runs = {name: pool.submit(measure, name, gw, stubs, load, rnd)
                for name, gw in gws.items()}
        return [run.result() for run in runs.values()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                    help="a patched copy of grm_service in DIR, ledger on")
    ap.add_argument("--env-variant", action="append", default=[], metavar="NAME=VAR=VALUE",
                    help="the checkout with one more env var (e.g. a ledger setting)")
    ap.add_argument("--fresh", action="store_true",
                    help="start every gateway anew for each of its runs: what one process's "
                         "start (its hash seed, its memory's layout) gives it is averaged out")
    ap.add_argument("--pin", action="store_true",
                    help="each gateway alone on CPU 0; this harness, the stubs and wrk on CPU 1:"
                         " where the scheduler puts them no longer varies from run to run")
    ap.add_argument("--together", action="store_true",
                    help="load every gateway at the same time (each its own wrk and cgroup), "
                         "and add a second ledger-off gateway: an A/A pair shows the method's "
                         "own error")
    ap.add_argument("--out", default="ledger-split")
    args = ap.parse_args()
    load = loadgen.Load(args.concurrency, args.duration)
    warm = loadgen.Load(args.concurrency, args.warmup)
    rows: list[Row] = []
    if args.pin:
        os.sched_setaffinity(0, {1})  # the stubs and wrk are started from here: they inherit it
    with procs.fleet() as f:
        stubs = [procs.start_stub(f, i) for i in range(2)]
        start = starters(f, [s.url for s in stubs], args)
        if args.pin:
            start = {name: lambda run=run: pin(run(), {0}) for name, run in start.items()}
        names = list(start)
        if args.together:
            names.insert(1, "ledger off (2)")
            start["ledger off (2)"] = lambda: procs.start_grm(
                f, [s.url for s in stubs], "split-off2", env_extra={"GRM_LEDGER": "false"})
            gws = {name: own_group(start[name](), name) for name in names}
            for rnd in range(args.rounds):
                together(gws, stubs, warm, rnd)
                rows += together(gws, stubs, load, rnd)
                print(f"round {rnd}: " + ", ".join(f"{r.contender} {r.rps:,.0f}"
                                                  for r in rows[-len(gws):]), file=sys.stderr)
        running = {} if args.fresh or args.together else {name: start[name]() for name in names}
        for rnd in range(0 if args.together else args.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for name in order:
                gw = running[name] if name in running else start[name]()
                loadgen.run_split([gw.url], warm)
                rows.append(measure(name, gw, stubs, load, rnd))
                if args.fresh:
                    gw.stop()
                print(f"round {rnd} {name}: {rows[-1].rps:,.0f} req/s", file=sys.stderr)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(table(rows, names))


if __name__ == "__main__":
    main()
