"""CPU and memory read from /proc: a process with its descendants, one thread, the RSS.

utime and stime count every thread of a process; a process's descendants are found by their
parent pid, so a gateway's workers and keeper count with it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (index 1 the ppid, 11 and 12 utime and
    stime in ticks, 19 the start time); OSError where the process has gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def user_system_seconds(pid: int) -> tuple[float, float]:
    """utime and stime of a process (all its threads) and of its live descendants, in one pass:
    the kernel's share (system calls, the sockets' copies and TCP) apart."""
    user = system = 0.0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat_fields(p)
            user, system = user + int(fields[11]) / _TICKS, system + int(fields[12]) / _TICKS
    return user, system


def cpu_seconds(pid: int, reaped: bool = False, alone: bool = False) -> float:
    """utime+stime of a process (all its threads) and of its live descendants (`alone`: not
    them); `reaped`: plus what each of them has waited for of its exited children
    (cutime+cstime)."""
    columns = (11, 12, 13, 14) if reaped else (11, 12)
    total = 0.0
    for p in [pid, *([] if alone else descendants(pid))]:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat_fields(p)
            total += sum(int(fields[i]) for i in columns) / _TICKS
    return total


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(stat_fields(int(entry.name))[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


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


def rss_kib(pid: int | str = "self") -> int:
    """VmRSS of a process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")
