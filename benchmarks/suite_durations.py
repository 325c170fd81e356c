"""The test suite's time per module, and the vLLM engines each module starts, from pytest logs.

Run the suite with every duration printed (the engine count is printed by tests/support/census.py
at the end of every run), then turn the log into a table; two logs give before and after side by
side:

    python -m pytest --durations=0 2>&1 | tee suite.log
    python benchmarks/suite_durations.py suite.log [after.log]

A module's time is the sum of its tests' setup, call and teardown, so a module-scoped fixture's
start-up counts in the module that first asks for it, and the run's shared engines in the first
module that uses them (while other tests ran beside them, part of it is hidden).
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

DURATION = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+(\S+?)::")
CENSUS = re.compile(r"^=+ vLLM engine starts: (\d+) =+$")
CENSUS_ROW = re.compile(r"^\s*(\d+)\s+(tests/\S+\.py)$")
SUMMARY = re.compile(r"^(?:=+ )?(.*\d+ passed.*) in ([\d.]+)s")


@dataclass
class Run:
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    engines: dict[str, int] = field(default_factory=dict)
    engine_total: int | None = None
    summary: str = ""
    wall_s: float = 0.0


def parse(path: Path) -> Run:
    run, in_census = Run(), False
    for line in path.read_text(errors="replace").splitlines():
        if match := DURATION.match(line):
            run.seconds[match[3]] += float(match[1])
        elif match := CENSUS.match(line):
            run.engine_total, in_census = int(match[1]), True
        elif in_census and (match := CENSUS_ROW.match(line)):
            run.engines[match[2]] = int(match[1])
        elif match := SUMMARY.match(line):
            run.summary, run.wall_s, in_census = match[1], float(match[2]), False
        elif line.startswith("="):
            in_census = False
    return run


def table(runs: list[Run], names: list[str]) -> str:
    modules = sorted({m for r in runs for m in r.seconds},
                     key=lambda m: -max(r.seconds.get(m, 0.0) for r in runs))
    head = " | ".join(f"{n} s | {n} engines" for n in names)
    lines = [f"| module | {head} |", "|---|" + "---:|" * (2 * len(runs))]
    for module in modules:
        cells = " | ".join(f"{r.seconds.get(module, 0.0):.1f} | {r.engines.get(module, 0)}"
                           for r in runs)
        lines.append(f"| {module} | {cells} |")
    totals = " | ".join(f"**{sum(r.seconds.values()):.0f}** (wall {r.wall_s:.0f}) | "
                        f"**{r.engine_total if r.engine_total is not None else '?'}**"
                        for r in runs)
    lines.append(f"| all | {totals} |")
    lines += [f"\n{name}: {r.summary} in {r.wall_s:.0f} s" for name, r in zip(names, runs,
                                                                               strict=True)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path, help="pytest --durations=0 logs")
    parser.add_argument("--names", nargs="*", help="column names (default: before, after)")
    args = parser.parse_args()
    names = args.names or (["before", "after"] if len(args.logs) == 2 else
                           [p.stem for p in args.logs])
    print(table([parse(p) for p in args.logs], names))


if __name__ == "__main__":
    main()
