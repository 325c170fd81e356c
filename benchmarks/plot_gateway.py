"""Throughput and p99 latency vs concurrency (medians over rounds, min-max bars) as one PNG.

Needs matplotlib: run it with the peers venv.

    benchmarks/.venv-peers/bin/python benchmarks/plot_gateway.py [results/gateway.json]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

RESULTS = Path(__file__).resolve().parent / "results"


def _series(runs: list[dict[str, float]], name: str, key: str) -> tuple[list[int], ...]:
    # A stalled run (no request done) has no latency and 0 req/s: off a log axis, so left out.
    done = [r for r in runs if r["contender"] == name and r["requests"] > 0]
    xs = sorted({int(r["concurrency"]) for r in done})
    med, lo, hi = [], [], []
    for c in xs:
        vals = [r[key] for r in done if r["concurrency"] == c]
        m = statistics.median(vals)
        med.append(m)
        lo.append(m - min(vals))
        hi.append(max(vals) - m)
    return xs, med, lo, hi


def plot(src: Path) -> Path:
    data = json.loads(src.read_text())
    runs = data["runs"]
    names = list(dict.fromkeys(r["contender"] for r in runs))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in names:
        xs, med, lo, hi = _series(runs, name, "rps")
        ax1.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=name)
        xs, med, lo, hi = _series(runs, name, "p99_ms")
        ax2.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=name)
    for ax, title, ylabel in ((ax1, "throughput", "req/s"), (ax2, "p99 latency", "ms")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrency (connections)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    meta = data.get("meta", {})
    fig.suptitle(f"gateways on {meta.get('replicas', '?')} stub replicas; "
                 f"median of {meta.get('rounds', '?')} rounds (bars: min-max); shared 2-core box",
                 fontsize=10)
    fig.tight_layout()
    out = src.with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS / "gateway.json"
    print(plot(src))


if __name__ == "__main__":
    main()
