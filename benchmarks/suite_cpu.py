"""Where a test run's CPU goes: every process on the machine sampled from /proc, its CPU time
summed by what it is (vLLM engines, gateways, pytest's workers, the fuzzer, Ray, ...).

Runs beside the command it is given and prints a table when that command ends. A process is
counted with the CPU it had used when last seen (sampled every `--every` seconds: one that lives
less than that is missed, and the last interval of each is not counted); one that ran before the
command counts from the command's start. A process is classed by its own command line, else by
its nearest classed ancestor (multiprocessing children, a gateway's workers).

    .venv/bin/python benchmarks/suite_cpu.py -- .venv/bin/python -m pytest --cov
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.cpu import stat_fields

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
# A process is (pid, start time in ticks): a pid the kernel hands out again is another process.
Key = tuple[int, int]


@dataclass
class Seen:
    ppid: int
    cmdline: str
    cpu_s: float


def read(pid: int) -> tuple[Key, Seen] | None:
    try:
        fields = stat_fields(pid)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    seen = Seen(int(fields[1]), f"{cmdline.decode(errors='replace').strip()} [{comm}]",
                (int(fields[11]) + int(fields[12])) / TICKS)
    return (pid, int(fields[19])), seen


def own_class(cmdline: str) -> str | None:
    return next((name for name, marks in CLASSES if any(m in cmdline for m in marks)), None)


def class_of(key: Key, seen: dict[Key, Seen], alive: dict[int, Key]) -> str:
    """By the process's own command line, else its parent's, and so on (a parent is looked up
    by pid among the processes last seen with it)."""
    for _ in range(64):
        if key not in seen:
            break
        found = own_class(seen[key].cmdline)
        if found:
            return found
        parent = alive.get(seen[key].ppid)
        if parent is None:
            break
        key = parent
    return "other"


def sample(seen: dict[Key, Seen], alive: dict[int, Key]) -> None:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = read(int(entry))
            if found is not None:
                seen[found[0]] = found[1]
                alive[int(entry)] = found[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    seen: dict[Key, Seen] = {}
    alive: dict[int, Key] = {}
    sample(seen, alive)
    before = {key: entry.cpu_s for key, entry in seen.items()}
    started = time.monotonic()
    child = subprocess.Popen(command)
    while child.poll() is None:
        sample(seen, alive)
        time.sleep(args.every)
    wall = time.monotonic() - started
    seen = {key: entry for key, entry in seen.items() if key[0] != os.getpid()}
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    for key, entry in seen.items():
        name = class_of(key, seen, alive)
        totals[name] = totals.get(name, 0.0) + entry.cpu_s - before.get(key, 0.0)
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
