"""Adapters fed the shapes the trainers really send (verl, OpenRLHF, TRL), over a mock service."""

from __future__ import annotations

import pytest
from PIL import Image

from grm_service.integrations import common, openrlhf, trl, verl
from grm_service.scoring.models import ItemResult


def result(score: float | None, status: str = "ok") -> ItemResult:
    return ItemResult(id="0", score=score, status=status,  # type: ignore[arg-type]
                      error=None if status == "ok" else "bad", digest="d")


def test_verl_sample_becomes_an_item() -> None:
    extra = {"split": "train", "index": 7, "question": "2+2?",
             "image": "data:image/png;base64,AAAA"}
    item = verl.to_item(3, "openai/gsm8k", "The answer is 4", "4", extra)
    assert (item.id, item.prompt, item.completion, item.reference) == (
        "3", "2+2?", "The answer is 4", "4")
    assert item.image == "data:image/png;base64,AAAA"
    assert item.extra == {"data_source": "openai/gsm8k"}
    assert verl.to_item(0, "s", "x", None, None).reference is None


def test_reward_or_refuses_silent_zeros() -> None:
    assert common.reward_or(result(0.5), None) == 0.5
    assert common.reward_or(result(None, "error"), -1.0) == -1.0
    with pytest.raises(common.ScoringError, match="error_score"):
        common.reward_or(result(None, "error"), None)


def test_openrlhf_query_is_split_into_prompt_and_response() -> None:
    req = openrlhf.RewardRequest(query=["<|im_start|>user\nQ<|im_end|>\nA!", "other"],
                                 prompts=["<|im_start|>user\nQ<|im_end|>\n", "P"],
                                 labels=["A", None])
    first, second = openrlhf.to_items(req)
    assert (first.completion, first.reference) == ("A!", "A")
    assert (second.completion, second.reference) == ("other", None)
    with pytest.raises(ValueError, match="differ in length"):
        openrlhf.to_items(openrlhf.RewardRequest(query=["a", "b"], prompts=["a"]))


def test_openrlhf_response_shape() -> None:
    out = openrlhf.to_response([result(0.25), result(None, "error")], error_reward=0.0)
    assert out["rewards"] == [0.25, 0.0] and out["scores"] == [0.25, 0.0]
    assert out["extra_logs"] == {"grm_error": [0.0, 1.0]}


def test_trl_standard_and_conversational_inputs() -> None:
    prompts = [[{"role": "system", "content": "s"}, {"role": "user", "content": "2+2?"}],
               "plain prompt"]
    completions = [[{"role": "assistant", "content": "4"}], "five"]
    image = Image.new("RGB", (8, 8), "white")
    items = trl.to_items(prompts, completions,
                         {"reference": ["4", "5"], "image": [image, None],
                          "completion_ids": [[1], [2]]}, "reference", "image")
    assert [(i.prompt, i.completion, i.reference) for i in items] == [
        ("2+2?", "4", "4"), ("plain prompt", "five", "5")]
    assert isinstance(items[0].image, str) and items[0].image.startswith("data:image/png")
    assert items[1].image is None
    assert trl.rewards([result(0.5), result(None, "error")]) == [0.5, None]


def test_text_of_content_parts() -> None:
    parts = [{"type": "image"}, {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert common.text_of([{"role": "user", "content": parts}]) == "ab"


def test_reward_function_needs_a_url() -> None:
    with pytest.raises(common.ScoringError, match="GRM_SERVICE_URL"):
        trl.GrmReward(url=None)
    assert trl.GrmReward(url="http://x", scorer="judge").__name__ == "grm_judge"
