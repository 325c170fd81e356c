"""verl's reward loop with an image-policy reward manager of verl-omni's shape calls
`pkg://grm_service.integrations.verl_omni` `compute_score_ocr` on generated pixels.

verl-omni is not on PyPI. `ImageRewardManager` below is this project's stand-in for its
`VisualRewardManager`: it does what that manager's `run_single` does with one sample (the uint8
`responses` tensor of the rollout passed as `solution_image`, by keyword, with `data_source`,
`ground_truth`, `extra_info`, and verl's reward-model keywords when verl runs one), registered in
verl 0.9's own reward-manager registry and run by verl's own `RewardLoopWorker`. The gateway's
`ocr` scorer runs on STUB replicas (answers derived from the request bytes): the score is
checked against the OCR rule on the answer it came back with.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from verl import DataProto
from verl.experimental.reward_loop import RewardLoopWorker
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from grm_service.integrations import verl_omni
from grm_service.scoring.ocr import ocr_score
from tests.support.procs import Proc
from tests.trainers.conftest import KEY
from tests.trainers.test_verl import verl_config

pytestmark = pytest.mark.trainers

TEXTS = ["HELLO", "WORLD", "GRM"]


@register("grm_test_image")
class ImageRewardManager(RewardManagerBase):
    """verl-omni's visual manager's per-sample call, as its source shows it."""

    def __init__(self, config: Any, tokenizer: Any, compute_score: Any,
                 reward_router_address: str | None = None,
                 reward_model_tokenizer: Any = None) -> None:
        super().__init__(config, tokenizer, compute_score)
        self.is_async_reward_score = inspect.iscoroutinefunction(compute_score)
        self.reward_router_address = reward_router_address

    async def run_single(self, data: DataProto) -> dict[str, Any]:
        item = data[0]
        pixels = item.batch["responses"]
        assert pixels.dtype == torch.uint8
        extra = dict(item.non_tensor_batch.get("extra_info", {}))
        kwargs = {"data_source": item.non_tensor_batch["data_source"], "solution_image": pixels,
                  "ground_truth": item.non_tensor_batch["reward_model"]["ground_truth"],
                  "extra_info": extra}
        result = await self.compute_score(**kwargs)
        info = {k: v for k, v in result.items() if k != "score"}
        return {"reward_score": result["score"], "reward_extra_info": info}


def images() -> torch.Tensor:
    """A rollout's generated images: uint8 (B, C, H, W), each distinct."""
    rng = np.random.default_rng(7)
    return torch.from_numpy(rng.integers(0, 256, (len(TEXTS), 3, 24, 32), dtype=np.uint8))


def image_batch() -> DataProto:
    return DataProto.from_dict(
        tensors={"responses": images()},
        non_tensors={
            "data_source": np.array(["ocr"] * len(TEXTS), dtype=object),
            "reward_model": np.array([{"ground_truth": t} for t in TEXTS], dtype=object),
            "extra_info": np.array([{"index": i} for i in range(len(TEXTS))], dtype=object),
        },
    )


@pytest.fixture
def loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[asyncio.AbstractEventLoop]:
    monkeypatch.setenv("GRM_API_KEY", KEY)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


def fingerprint_id(gateway: Proc) -> str:
    answer = httpx.get(gateway.url + "/v1/fingerprint", headers={"authorization": f"Bearer {KEY}"})
    return str(answer.json()["fingerprint_id"])


def test_reward_loop_scores_generated_images(
    gateway: Proc, tiny_policy: Path, loop: asyncio.AbstractEventLoop
) -> None:
    prefix = "reward.custom_reward_function"
    worker = RewardLoopWorker(verl_config([
        f"actor_rollout_ref.model.path={tiny_policy}",
        "reward.reward_manager.name=grm_test_image",
        f"{prefix}.path=pkg://grm_service.integrations.verl_omni",
        f"{prefix}.name=compute_score_ocr",
        f"+{prefix}.reward_kwargs.url={gateway.url}",
    ]))

    outputs = worker.loop.run_until_complete(worker.compute_score_batch(image_batch()))

    extra = [o["reward_extra_info"] for o in outputs]
    for output, info, text in zip(outputs, extra, TEXTS, strict=True):
        assert info["grm_error"] == 0.0 and info["genrm_response"].startswith("stub-")
        assert output["reward_score"] == ocr_score(info["genrm_response"], text)
    assert {e["grm_fingerprint"] for e in extra} == {fingerprint_id(gateway)}
    assert len({e["genrm_response"] for e in extra}) == len(TEXTS), "each image its own"
    worker.loop.run_until_complete(verl_omni.close_clients())


def test_one_image_in_any_form_scores_the_same(
    gateway: Proc, loop: asyncio.AbstractEventLoop
) -> None:
    chw = images()[0]

    async def score(image: Any, **extra: Any) -> dict[str, Any]:
        return await verl_omni.compute_score_ocr("ocr", image, "HELLO", extra, url=gateway.url)

    forms = [chw, chw.permute(1, 2, 0).numpy(), chw.float() / 255.0]
    answers = [loop.run_until_complete(score(f)) for f in forms]
    # A video of 8 frames (T, C, H, W): every 4th frame is scored, 2 requests, the mean.
    video = loop.run_until_complete(score(torch.stack([chw] * 8), frame_interval=4))
    loop.run_until_complete(verl_omni.close_clients())

    assert answers[0] == answers[1] == answers[2], "same pixels, same PNG, same answer"
    assert video["score"] == answers[0]["score"]
    assert video["genrm_response"] == answers[0]["genrm_response"]
