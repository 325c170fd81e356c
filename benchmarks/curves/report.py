"""The table and the plot of reward_curves.py, from its JSON (rewards stored as `float.hex`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from . import cache

PAIRS = (("grm A", "grm B"), ("plain A", "plain B"))
STYLES = {"grm A": ("tab:blue", "-", "o"), "grm A again": ("tab:green", ":", "."),
          "grm B": ("tab:cyan", "--", "x"), "plain A": ("tab:red", "-", "s"),
          "plain B": ("tab:orange", "--", "+")}


def values(step: dict[str, Any]) -> list[float]:
    return [math.nan if r is None else float.fromhex(r) for r in step["rewards"]]


def mean(step: dict[str, Any]) -> float:
    scored = [v for v in values(step) if not math.isnan(v)]
    return math.fsum(scored) / len(scored) if scored else math.nan


def differing(a: dict[str, Any], b: dict[str, Any]) -> int:
    """Rewards of one step whose bits differ (the hex strings are the bits)."""
    return sum(x != y for x, y in zip(a["rewards"], b["rewards"], strict=True))


def parting(a: list[dict[str, Any]], b: list[dict[str, Any]], key: str) -> int | None:
    """The first step (1-based) where `key` differs, None if never."""
    return next((i + 1 for i, (x, y) in enumerate(zip(a, b, strict=True)) if x[key] != y[key]),
                None)


def cell(a: dict[str, Any], b: dict[str, Any]) -> str:
    n = differing(a, b)
    same_policy = "" if a["completions"] == b["completions"] else " (other completions)"
    return "identical" if n == 0 else f"{n}/{len(a['rewards'])} differ{same_policy}"


def table(runs: dict[str, Any]) -> list[str]:
    names = [n for n in ("grm A", "grm B", "plain A", "plain B") if n in runs]
    lines = ["| step | " + " | ".join(f"{n} mean" for n in names) + " | grm A vs B | "
             "plain A vs B |", "|---" * (len(names) + 3) + "|"]
    steps = min(len(runs[n]["steps"]) for n in names)
    for i in range(steps):
        row = [f"{mean(runs[n]['steps'][i]):.6f}" for n in names]
        for a, b in PAIRS:
            row.append(cell(runs[a]["steps"][i], runs[b]["steps"][i])
                       if a in runs and b in runs else "-")
        lines.append(f"| {i + 1} | " + " | ".join(row) + " |")
    return lines


def verdicts(runs: dict[str, Any]) -> list[str]:
    out = []
    for a, b in PAIRS:
        if a not in runs or b not in runs:
            continue
        sa, sb = runs[a]["steps"], runs[b]["steps"]
        total = sum(differing(x, y) for x, y in zip(sa, sb, strict=True))
        rewards = sum(len(x["rewards"]) for x in sa)
        first = parting(sa, sb, "rewards")
        if first is None:
            out.append(f"{a} vs {b}: identical bit for bit, {rewards} rewards over {len(sa)} "
                       "steps")
            continue
        policy = parting(sa, sb, "completions")
        out.append(f"{a} vs {b}: part at step {first} ({total} of {rewards} rewards differ; "
                   f"the completions first differ at step {policy})")
    return out


def plot(data: dict[str, Any], png: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no plot")
        return False
    runs = data["runs"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, run in runs.items():
        color, line, marker = STYLES[name]
        xs = range(1, len(run["steps"]) + 1)
        ax.plot(xs, [mean(s) for s in run["steps"]], color=color, linestyle=line,
                marker=marker, label=name)
    ax.axvline(data["kill_step"], color="grey", linewidth=0.8, linestyle=":")
    ax.axvline(data["back_step"], color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("GRPO step (B: replica 1 killed before the first dotted line, back by the "
                  "second)")
    ax.set_ylabel("mean judge reward of the step")
    ax.set_title("TRL GRPOTrainer, GenRM judge: grm-service vs plain vLLM behind round robin")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def report(data: dict[str, Any], source: Path) -> None:
    runs = data["runs"]
    print("\n".join(table(runs)))
    print()
    print("\n".join(verdicts(runs) + cache.lines(data)))
    png = source.with_suffix(".png")
    if plot(data, png):
        print(f"plot: {png}")
