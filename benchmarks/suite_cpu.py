"""Where a test run's CPU goes: every process on the machine sampled from /proc, its CPU time
summed by what it is (vLLM engines, gateways, pytest's workers, the fuzzer, Ray, ...).

Runs beside the command it is given and prints a table when that command ends; a process is
counted with the CPU it had used when last seen (sampled every `--every` seconds, so a process
that lives less than that is missed, and the last interval of each is not counted; what ran
before the command counts from its start). A process is
classed by its own command line, else by its nearest classed ancestor (multiprocessing children,
a gateway's workers).

    .venv/bin/python benchmarks/suite_cpu.py -- .venv/bin/python -m pytest --cov
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass

# (class, any of these in the command line), first match wins.
CLASSES = [
    ("vLLM engine", ("VLLM::", "vllm.entrypoints", "grm_service.cli backend",
                     "grm_service.replicas.reaper")),
    ("gateway", ("grm_service.cli serve", "grm-service serve")),
    ("STUB replica", ("stub_openai",)),
    ("schemathesis", ("schemathesis",)),
    ("Ray", ("ray::", "/ray/", "raylet", "gcs_server", "bin/ray ")),
    ("PostgreSQL", ("postgres",)),
    ("other CLI", ("grm_service.cli", "bin/grm-service")),
    ("pytest", ("pytest",)),
]
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Seen:
    ppid: int
    cmdline: str
    cpu_s: float


def read(pid: int) -> Seen | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    return Seen(int(fields[1]), f"{cmdline} [{comm}]", (int(fields[11]) + int(fields[12])) / TICKS)


def own_class(cmdline: str) -> str | None:
    return next((name for name, marks in CLASSES if any(m in cmdline for m in marks)), None)


def class_of(pid: int, seen: dict[int, Seen]) -> str:
    hops = 0
    while pid in seen and hops < 64:
        found = own_class(seen[pid].cmdline)
        if found:
            return found
        pid, hops = seen[pid].ppid, hops + 1
    return "other"


def sample(seen: dict[int, Seen]) -> None:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            now = read(int(entry))
            if now is not None:
                old = seen.get(int(entry))
                # A pid reused by a new process starts its own count.
                if old is not None and old.cmdline == now.cmdline and now.cpu_s < old.cpu_s:
                    continue
                seen[int(entry)] = now


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    seen: dict[int, Seen] = {}
    sample(seen)
    # What ran before the command counts only from now on.
    before = {pid: entry.cpu_s for pid, entry in seen.items()}
    started = time.monotonic()
    child = subprocess.Popen(command)
    while child.poll() is None:
        sample(seen)
        time.sleep(args.every)
    wall = time.monotonic() - started
    seen.pop(os.getpid(), None)
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    for pid, entry in seen.items():
        name = class_of(pid, seen)
        totals[name] = totals.get(name, 0.0) + entry.cpu_s - before.get(pid, 0.0)
        counts[name] = counts.get(name, 0) + 1
    total = sum(totals.values())
    print("\n| what | CPU s | share | processes |\n|---|---:|---:|---:|", file=sys.stderr)
    for name, cpu in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {cpu:.0f} | {cpu / total:.0%} | {counts[name]} |", file=sys.stderr)
    print(f"| all | {total:.0f} | 100% | {len(seen)} |", file=sys.stderr)
    print(f"wall {wall:.0f} s, exit {child.returncode}", file=sys.stderr)
    return child.returncode


if __name__ == "__main__":
    raise SystemExit(main())
