"""`/aggregate_metrics`' statistics: per task in index order, the same bits in any order."""

from __future__ import annotations

import random

from grm_service.scoring.gym_metrics import aggregate

ROWS = [{"_ng_task_index": t, "_ng_rollout_index": r, "reward": 0.1 * (t + r)}
        for t in range(3) for r in range(4)]


def test_each_task_and_the_whole_collection_are_summarised() -> None:
    out = aggregate(ROWS)
    assert [g["_ng_task_index"] for g in out["group_level_metrics"]] == [0, 1, 2]
    first = out["group_level_metrics"][0]
    assert (first["min/reward"], first["max/reward"]) == (0.0, 0.1 * 3)
    assert abs(first["mean/reward"] - 0.15) < 1e-12 and first["std/reward"] > 0
    assert out["key_metrics"] == {"mean/reward": out["agent_metrics"]["mean/reward"]}


def test_any_order_gives_the_same_bits() -> None:
    shuffled = ROWS[:]
    random.Random(7).shuffle(shuffled)
    assert aggregate(shuffled) == aggregate(ROWS)


def test_nothing_to_summarise_is_an_empty_answer() -> None:
    assert aggregate([]) == {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}}
    assert aggregate([{"_ng_task_index": 0, "reward": 1.0}])["agent_metrics"]["std/reward"] == 0
