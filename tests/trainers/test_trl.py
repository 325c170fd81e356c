"""TRL's own GRPOTrainer trains on CPU with grm-service's sync and async reward functions."""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import pickle
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import is_async_callable

from grm_service.integrations.trl import async_grm_reward, grm_reward
from tests.support.procs import Proc
from tests.trainers.conftest import KEY

pytestmark = pytest.mark.trainers

PROMPTS = ["What is 2+2?", "Name a colour.", "FAIL: this prompt's items fail.", "Say hi."]


def test_trl_recognises_the_async_function() -> None:
    # TRL's own test for "await this one": the async function must pass, the sync one not.
    assert is_async_callable(async_grm_reward("http://x", "trainer"))
    assert not is_async_callable(grm_reward("http://x", "trainer"))


def test_grpo_trains_two_steps_with_both_reward_functions(
    gateway: Proc, tiny_policy: Path, tmp_path: Path
) -> None:
    dataset = Dataset.from_dict({
        "prompt": [[{"role": "user", "content": p}] for p in PROMPTS],
        "reference": ["4", "red", "x", "hi"],
    })
    rewards = [grm_reward(gateway.url, "trainer", api_key=KEY, name="grm_sync"),
               async_grm_reward(gateway.url, "trainer", api_key=KEY, name="grm_async")]
    args = GRPOConfig(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=8,
        num_generations=2, max_completion_length=8, learning_rate=1e-4, logging_steps=1,
        report_to=[], use_cpu=True, bf16=False, save_strategy="no", seed=0,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=str(tiny_policy), reward_funcs=rewards, args=args,
                          train_dataset=dataset)

    trainer.train()

    logged = [entry for entry in trainer.state.log_history if "rewards/grm_sync/mean" in entry]
    assert len(logged) == 2  # one entry per step, both functions in each
    for entry in logged:
        assert math.isfinite(entry["rewards/grm_sync/mean"])
        assert entry["rewards/grm_sync/mean"] == entry["rewards/grm_async/mean"]
    # TRL's per-sample record of this run: failed items are NaN ("no reward"), the others scores.
    per_sample = {name: list(values) for name, values in trainer._logs["rewards"].items()}
    prompts = [str(p) for p in trainer._logs["prompt"]]
    for name in ("grm_sync", "grm_async"):
        failed = [math.isnan(v) for v in per_sample[name]]
        assert failed == ["FAIL" in p for p in prompts], (name, prompts, per_sample[name])
        assert all(0 <= v <= 1 for v in per_sample[name] if not math.isnan(v))
        # log_extra: each completion's fingerprint id and error in TRL's completions table.
        errors = list(trainer._logs["extra"][f"{name}/grm_error"])
        assert [bool(e) for e in errors] == failed
        assert set(trainer._logs["extra"][f"{name}/grm_fingerprint"]) - {""}
        # log_metric: the error rate, averaged per logging step (1 of 4 prompts fails).
        for entry in logged:
            assert entry[f"{name}/grm_error_rate"] == pytest.approx(0.25)


def score_in_child(pickled: bytes, queue: Any) -> None:
    """What AsyncGRPOTrainer's spawned rollout process does with a reward function."""
    reward = pickle.loads(pickled)
    call = reward(prompts=["What is 2+2?", "FAIL"], completions=["4", "4"],
                  completion_ids=[[1], [1]], reference=["4", "4"])
    queue.put(asyncio.run(call) if asyncio.iscoroutine(call) else call)


def test_reward_functions_survive_async_grpos_spawned_process(gateway: Proc) -> None:
    # TRL 1.16's AsyncGRPOTrainer needs a vLLM server to start, so its step is done by hand:
    # pickle the reward functions, unpickle and call them in a `spawn` child.
    ctx = multiprocessing.get_context("spawn")
    for reward in (grm_reward(gateway.url, "trainer", api_key=KEY),
                   async_grm_reward(gateway.url, "trainer", api_key=KEY)):
        queue = ctx.Queue()
        child = ctx.Process(target=score_in_child, args=(pickle.dumps(reward), queue))
        child.start()
        answer = queue.get(timeout=120)
        child.join(timeout=30)
        assert child.exitcode == 0
        assert answer == [1.0, None]
