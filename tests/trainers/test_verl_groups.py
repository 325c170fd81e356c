"""verl 0.9's reward loop, configured with grm-service's group reward manager as
docs/groups-held.md says, sends each sample with its group: `uid` and `rollout.n`, under an id
of its own. The gateway (on stub replicas) is under test; its `groupshape` scorer answers with
a number made of what it received."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoTokenizer
from verl import DataProto
from verl.experimental.reward_loop import RewardLoopWorker

from grm_service.integrations import verl as adapter
from grm_service.integrations import verl_groups
from tests.support.procs import Proc
from tests.support.scoring import group_shape
from tests.trainers.test_verl import key_in_env, overrides, verl_config

__all__ = ["key_in_env"]

N = 2  # actor_rollout_ref.rollout.n
UIDS = ["3f1c-prompt-a", "9d2e-prompt-b"]
# The second prompt's two samples are the same text: still two items of the group.
ANSWERS = ["4", "four", "blue", "blue"]


def group_overrides(gateway: Proc, policy: Path) -> list[str]:
    shape = [o.replace("reward_kwargs.scorer=trainer", "reward_kwargs.scorer=groupshape")
             for o in overrides(gateway, policy)]
    return [*shape, f"actor_rollout_ref.rollout.n={N}",
            "reward.reward_manager.source=importlib",
            f"reward.reward_manager.name={verl_groups.MANAGER}",
            "reward.reward_manager.module.path=pkg://grm_service.integrations.verl_groups"]


def grouped_batch(tokenizer: Any) -> DataProto:
    """Two prompts, each repeated N times as verl's `repeat(interleave=True)` leaves them: one
    uid and one extra_info dict (the same object) per prompt."""
    pad = tokenizer.pad_token_id
    prompts = [tokenizer.encode(q) for q in ("2+2?", "2+2?", "sky?", "sky?")]
    responses = [[*tokenizer.encode(a), tokenizer.eos_token_id] for a in ANSWERS]
    p_len, r_len = max(map(len, prompts)), max(map(len, responses))
    infos = [{"question": "2+2?", "index": 0}, {"question": "sky?", "index": 1}]
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor([[pad] * (p_len - len(p)) + p for p in prompts]),
            "responses": torch.tensor([r + [pad] * (r_len - len(r)) for r in responses]),
            "attention_mask": torch.tensor([[0] * (p_len - len(p)) + [1] * (len(p) + len(r))
                                            + [0] * (r_len - len(r))
                                            for p, r in zip(prompts, responses, strict=True)]),
        },
        non_tensors={
            "data_source": np.array(["openai/gsm8k"] * 4, dtype=object),
            "reward_model": np.array([{"ground_truth": "x", "style": "rule"}] * 4, dtype=object),
            "extra_info": np.array([infos[i // N] for i in range(4)], dtype=object),
            "uid": np.array([UIDS[i // N] for i in range(4)], dtype=object),
        },
    )


def test_the_group_reward_manager_sends_each_sample_with_its_uid_and_rollout_n(
    gateway: Proc, tiny_policy: Path, loop: asyncio.AbstractEventLoop, key_in_env: None
) -> None:
    worker = RewardLoopWorker(verl_config(group_overrides(gateway, tiny_policy)))
    data = grouped_batch(AutoTokenizer.from_pretrained(str(tiny_policy)))
    shared = data.non_tensor_batch["extra_info"][0]

    outputs = worker.loop.run_until_complete(worker.compute_score_batch(data))

    # verl loaded our manager by its pkg:// path: a naive manager, the adapter its function.
    manager = worker.reward_manager
    assert type(manager).__name__ == verl_groups.MANAGER
    assert type(manager).__mro__[1].__name__ == "NaiveRewardManager"
    assert manager.compute_score.args[0] is adapter.compute_score
    # Each sample reached the gateway with its prompt's uid, the group's size, and an id of its
    # own (32 hex digits, not the batch position "0".."3": two texts of one group are equal).
    want = [group_shape(UIDS[i // N], N, 32) for i in range(4)]
    assert [o["reward_score"] for o in outputs] == want
    assert [o["reward_extra_info"]["grm_error"] for o in outputs] == [0.0] * 4
    # The prompt's shared extra_info dict was not written through (each sample got its own).
    assert shared == {"question": "2+2?", "index": 0}
    worker.loop.run_until_complete(adapter.close_clients())
