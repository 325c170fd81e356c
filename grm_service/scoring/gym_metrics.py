"""NeMo Gym's `POST /aggregate_metrics`: the rewards of verified rollouts, summarised per task
and over all, as a resources server answers it at the end of a rollout collection.

Each statistic is named `STAT/FIELD` (`mean/reward`, ...), the names Gym's own resources
servers log; the headline metrics are the means. Sums are exactly rounded (`math.fsum`) and
the tasks are in index order, so the same responses give the same bits in any order.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

TASK_KEY = "_ng_task_index"
FIELDS = ("reward",)


def _numbers(rows: Sequence[Mapping[str, Any]], field: str) -> list[float]:
    return [float(r[field]) for r in rows
            if isinstance(r.get(field), int | float) and not isinstance(r.get(field), bool)]


def stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """mean, max, min, median and sample std (0 for one value) of each field present."""
    out: dict[str, float] = {}
    for field in FIELDS:
        values = sorted(_numbers(rows, field))
        if not values:
            continue
        mean = math.fsum(values) / len(values)
        spread = (math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
                  if len(values) > 1 else 0.0)
        out |= {f"mean/{field}": mean, f"max/{field}": values[-1], f"min/{field}": values[0],
                f"median/{field}": statistics.median(values), f"std/{field}": spread}
    return out


def aggregate(responses: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Gym's `AggregateMetrics` of `responses` (verify responses, each with its task index)."""
    tasks: dict[int, list[Mapping[str, Any]]] = {}
    for row in responses:
        index = row.get(TASK_KEY, 0)
        tasks.setdefault(index if isinstance(index, int) else 0, []).append(row)
    groups = [{TASK_KEY: index, **stats(rows)} for index, rows in sorted(tasks.items())]
    overall = stats(responses)
    return {"group_level_metrics": groups if responses else [], "agent_metrics": overall,
            "key_metrics": {k: v for k, v in overall.items() if k.startswith("mean/")}}
