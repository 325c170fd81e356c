"""The TRL image reward (`grm_image_reward`, `async_grm_image_reward`) called as TRL calls a reward
function (`prompts=`, `completions=`, `completion_ids=`, the dataset's columns and its logging
hooks), the completions being generated images, against a gateway on recording STUB replicas:
each image reaches the `reward_head` scorer with its prompt's text (the STUBs' /classify answers
(0.25, 0.75) raw)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from PIL import Image
from trl.trainer.utils import is_async_callable

from grm_service.integrations.trl import async_grm_image_reward, grm_image_reward
from tests.support.procs import Proc, received
from tests.trainers.conftest import KEY

pytestmark = pytest.mark.trainers


def test_image_rewards_in_trls_call_shape(served: tuple[Proc, list[Proc]],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    gateway, stubs = served
    monkeypatch.setenv("GRM_API_KEY", KEY)
    received(stubs, clear=True)
    prompts = [[{"role": "user", "content": "a white square"}], "a black square", "no image"]
    shots: list[Any] = [Image.new("RGB", (16, 16), "white"), Image.new("RGB", (16, 16), "black"),
                        None]
    logged: dict[str, list[Any]] = {}
    sync = grm_image_reward(gateway.url, "reward_head")
    asynchronous = async_grm_image_reward(gateway.url, "reward_head",
                                          options={"head": "hpsv3", "scale": 4})
    assert is_async_callable(asynchronous) and not is_async_callable(sync)

    plain = sync(prompts=prompts, completions=shots, completion_ids=[[1], [2], [3]],
                 log_extra=lambda k, v: logged.setdefault(k, v))
    scaled = asyncio.run(asynchronous(prompts=prompts, completions=shots,
                                      completion_ids=[[1], [2], [3]]))

    assert plain == [0.25, 0.25, None] and scaled == [1.0, 1.0, None]
    assert "needs an image" in logged["grm_reward_head/grm_error"][2]
    texts = [r["body"]["messages"][0]["content"][1]["text"]  # type: ignore[index]
             for r in received(stubs) if r["path"] == "/classify"]
    assert sorted(texts) == sorted(["a white square", "a black square"] * 2)
