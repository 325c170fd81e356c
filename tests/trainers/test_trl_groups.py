"""TRL's own GRPOTrainer with a group reward: each prompt's completions judged together by the
`pairwise` scorer, on a keyed gateway over STUB replicas (their answer is a digest of the body,
so a judgment depends on every byte the service sends)."""

from __future__ import annotations

import asyncio
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from grm_service.integrations.trl import async_group_reward, group_reward
from tests.support.groups import PAIRWISE_HEX
from tests.support.procs import Proc, received
from tests.trainers.conftest import KEY

pytestmark = pytest.mark.trainers

PROMPTS = ["What is 2+2?", "Name a colour.", "Say hi.", "Count to three."]


def judged_prompts(stubs: list[Proc]) -> list[str]:
    return [json.dumps(r["body"]) for r in received(stubs) if "compare two" in json.dumps(r)]


def test_grpo_trains_with_a_group_reward_each_prompts_completions_judged_together(
    served: tuple[Proc, list[Proc]], tiny_policy: Path, tmp_path: Path
) -> None:
    gateway, stubs = served
    received(stubs, clear=True)
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in PROMPTS]})
    reward = group_reward(gateway.url, "pairwise", num_generations=4, api_key=KEY,
                          options={**PAIRWISE_HEX, "strategy": "all_pairs"}, name="grm_group")
    args = GRPOConfig(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=8, learning_rate=1e-4, logging_steps=1,
        report_to=[], use_cpu=True, bf16=False, save_strategy="no", seed=0,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=str(tiny_policy), reward_funcs=[reward], args=args,
                          train_dataset=dataset)

    trainer.train()

    values = list(trainer._logs["rewards"]["grm_group"])
    assert len(values) == 8 and all(0 <= v <= 1 for v in values), values  # no NaN: none failed
    bodies = judged_prompts(stubs)
    assert bodies  # 2 prompts of 4 completions, all pairs: 6 each, fewer for equal completions
    for body in bodies:  # never two prompts' completions in one comparison
        assert sum(p.replace("?", "") in body for p in PROMPTS) == 1


async def test_a_group_rewards_call_gives_the_same_rewards_in_any_order(gateway: Proc) -> None:
    prompts = [p for p in PROMPTS[:2] for _ in range(4)]
    completions = [f"answer {n}" for n in range(8)]
    kwargs: dict[str, Any] = {"completion_ids": [[n] for n in range(8)]}
    rewards = [group_reward(gateway.url, "pairwise", num_generations=4, api_key=KEY,
                            options=PAIRWISE_HEX),
               async_group_reward(gateway.url, "listwise", api_key=KEY,
                                  options={"pattern": r"([1-4])([0-9a-f])", "min": 0,
                                           "max": 9})]
    for reward in rewards:
        order = list(range(8))
        random.Random(1).shuffle(order)

        def call(idx: list[int], reward: Any = reward) -> Any:
            return reward(prompts=[prompts[i] for i in idx],
                          completions=[completions[i] for i in idx],
                          completion_ids=[kwargs["completion_ids"][i] for i in idx])

        first = call(list(range(8)))
        again = call(order)
        if asyncio.iscoroutine(first):
            first, again = await first, await again
        by_item = dict(zip(order, again, strict=True))
        assert [by_item[i] for i in range(8)] == first
        assert any(v is not None for v in first)
        assert all(v is None or (0 <= v <= 1 and not math.isnan(v)) for v in first)
