"""verl 0.9's reward loop (its RewardLoopWorker and naive reward manager, configured as the docs
say) calls grm-service's `compute_score` on a real DataProto batch; and verl's batch manager."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import verl
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer
from verl import DataProto
from verl.experimental.reward_loop import RewardLoopWorker
from verl.workers.reward_manager.batch import BatchRewardManager

from grm_service.integrations import microbatch
from grm_service.integrations import verl as adapter
from tests.support.procs import Proc
from tests.trainers.conftest import KEY

pytestmark = pytest.mark.trainers

QUESTIONS = ["What is 2+2?", "FAIL: this item fails", "Name a colour."]
ANSWERS = ["4", "x", "blue sky"]
# As verl's parquet loader hands them over: numpy arrays of acceptable answers, or strings.
GROUND_TRUTHS: list[Any] = [np.array(["four", "4"]), "x", "red"]


def overrides(gateway: Proc, policy: Path) -> list[str]:
    """The command-line settings docs/integrations.md gives for verl 0.9 (the key is in the
    environment: verl prints reward_kwargs)."""
    prefix = "reward.custom_reward_function"
    return [
        f"actor_rollout_ref.model.path={policy}",
        f"{prefix}.path=pkg://grm_service.integrations.verl",
        f"{prefix}.name=compute_score",
        f"+{prefix}.reward_kwargs.url={gateway.url}",
        f"+{prefix}.reward_kwargs.scorer=trainer",
        f"+{prefix}.reward_kwargs.error_score=-1.0",
        f"+{prefix}.reward_kwargs.timeout=30",
        f"+{prefix}.reward_kwargs.retries=1",
    ]


def batch(tokenizer: Any) -> DataProto:
    """Left-padded prompts, right-padded responses ending in EOS, as verl's rollout leaves them."""
    pad = tokenizer.pad_token_id
    prompts = [tokenizer.encode(q) for q in QUESTIONS]
    responses = [[*tokenizer.encode(a), tokenizer.eos_token_id] for a in ANSWERS]
    p_len, r_len = max(map(len, prompts)), max(map(len, responses)) + 2
    prompt_ids = torch.tensor([[pad] * (p_len - len(p)) + p for p in prompts])
    response_ids = torch.tensor([r + [pad] * (r_len - len(r)) for r in responses])
    mask = torch.tensor([[0] * (p_len - len(p)) + [1] * len(p) + [1] * len(r)
                         + [0] * (r_len - len(r)) for p, r in zip(prompts, responses, strict=True)])
    return DataProto.from_dict(
        tensors={"prompts": prompt_ids, "responses": response_ids, "attention_mask": mask,
                 "input_ids": torch.cat([prompt_ids, response_ids], dim=1)},
        non_tensors={
            "data_source": np.array(["openai/gsm8k"] * 3, dtype=object),
            "reward_model": np.array([{"ground_truth": g, "style": "rule"}
                                      for g in GROUND_TRUTHS], dtype=object),
            "extra_info": np.array([{"question": q, "index": i}
                                    for i, q in enumerate(QUESTIONS)], dtype=object),
        },
    )


def fingerprint_id(gateway: Proc) -> str:
    answer = httpx.get(gateway.url + "/v1/fingerprint", headers={"authorization": f"Bearer {KEY}"})
    return str(answer.json()["fingerprint_id"])


@pytest.fixture
def key_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRM_API_KEY", KEY)


def verl_config(config_overrides: list[str]) -> Any:
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose("ppo_trainer", overrides=config_overrides)


def test_reward_loop_worker_scores_a_dataproto(
    gateway: Proc, tiny_policy: Path, loop: asyncio.AbstractEventLoop, key_in_env: None
) -> None:
    worker = RewardLoopWorker(verl_config(overrides(gateway, tiny_policy)))
    data = batch(AutoTokenizer.from_pretrained(str(tiny_policy)))

    outputs = worker.loop.run_until_complete(worker.compute_score_batch(data))

    scores = [o["reward_score"] for o in outputs]
    extra = [o["reward_extra_info"] for o in outputs]
    assert scores[:2] == [1.0, -1.0]  # "4" is the numpy ground truth's 2nd answer; FAIL failed
    assert 0 <= scores[2] < 1
    assert [e["grm_error"] for e in extra] == [0.0, 1.0, 0.0]
    assert {extra[0]["grm_fingerprint"], extra[2]["grm_fingerprint"]} == {fingerprint_id(gateway)}
    # verl loaded the adapter by its pkg:// path and awaited it; its calls shared one client.
    assert worker.reward_manager.compute_score.args[0] is adapter.compute_score
    assert worker.reward_manager.is_async_reward_score

    async def clients() -> int:
        return microbatch.clients_of_this_loop()

    assert worker.loop.run_until_complete(clients()) == 1
    worker.loop.run_until_complete(adapter.close_clients())


def test_a_typo_in_reward_kwargs_fails_by_name(
    gateway: Proc, tiny_policy: Path, loop: asyncio.AbstractEventLoop, key_in_env: None
) -> None:
    typo = [o.replace("reward_kwargs.scorer=", "reward_kwargs.scorrer=")
            for o in overrides(gateway, tiny_policy)]
    worker = RewardLoopWorker(verl_config(typo))

    with pytest.raises(TypeError, match="scorrer"):
        worker.loop.run_until_complete(worker.compute_score_batch(
            batch(AutoTokenizer.from_pretrained(str(tiny_policy)))))


def test_batch_reward_manager_with_compute_score_batch(
    gateway: Proc, tiny_policy: Path, key_in_env: None
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_policy))
    score = partial(adapter.compute_score_batch, url=gateway.url, scorer="trainer",
                    error_score=-1.0)
    manager = BatchRewardManager(tokenizer, num_examine=0, compute_score=score)

    answer = manager(batch(tokenizer), return_dict=True)

    rewards = answer["reward_tensor"].sum(dim=1).tolist()
    assert rewards[:2] == [1.0, -1.0] and 0 <= rewards[2] < 1
    assert answer["reward_extra_info"]["grm_error"] == [0.0, 1.0, 0.0]
