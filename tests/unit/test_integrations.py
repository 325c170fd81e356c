"""Adapters fed the shapes the trainers really send (verl, OpenRLHF, TRL), over a mock service."""

from __future__ import annotations

import inspect

import numpy as np
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


def test_verl_ground_truths_numpy_and_lists() -> None:
    # verl's parquet loader hands lists of acceptable answers over as numpy arrays.
    item = verl.to_item(0, "s", "four", np.array(["4", "four"]), None)
    assert (item.reference, item.extra["references"]) == ("4", ["4", "four"])
    assert verl.to_item(0, "s", "x", np.array(["4"]), None).reference == "4"
    assert verl.to_item(0, "s", "x", [4, 4.5], None).extra["references"] == ["4", "4.5"]
    assert verl.to_item(0, "s", "x", np.int64(7), None).reference == "7"
    assert "references" not in verl.to_item(0, "s", "x", "4", None).extra


def test_verl_compute_score_is_a_coroutine_function() -> None:
    # verl's reward loop awaits coroutine functions and runs others on a thread pool.
    assert inspect.iscoroutinefunction(verl.compute_score)


def test_openrlhf_query_is_split_into_prompt_and_response() -> None:
    req = openrlhf.RewardRequest(query=["<|im_start|>user\nQ<|im_end|>\nA!", "other"],
                                 prompts=["<|im_start|>user\nQ<|im_end|>\n", "P"],
                                 labels=["A", None])
    first, second = openrlhf.to_items(req)
    assert (first.prompt, first.completion, first.reference) == ("user\nQ", "A!", "A")
    assert (second.completion, second.reference) == ("other", None)
    with pytest.raises(ValueError, match="differ in length"):
        openrlhf.to_items(openrlhf.RewardRequest(query=["a", "b"], prompts=["a"]))


@pytest.mark.parametrize(("special_tokens", "completion"), [
    ("auto", "A!"),
    ("keep", "A!<|im_end|><|endoftext|>"),
    ("<|im_end|>", "A!<|endoftext|>"),
    ("<|endoftext|>,<|im_end|>", "A!"),
])
def test_openrlhf_special_tokens_are_stripped_as_asked(special_tokens: str,
                                                       completion: str) -> None:
    prompt = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    req = openrlhf.RewardRequest(query=[prompt + "A!<|im_end|><|endoftext|>"], prompts=[prompt])
    assert openrlhf.to_items(req, special_tokens)[0].completion == completion


def test_openrlhf_other_templates_tokens() -> None:
    for query in ("A!<eos>", "A!<end_of_turn>", "A!</s>", "A!<|eot_id|>"):
        assert openrlhf.to_items(openrlhf.RewardRequest(query=[query]))[0].completion == "A!"
    with pytest.raises(ValueError, match="special_tokens"):
        openrlhf.token_pattern(",")


def test_openrlhf_response_shape() -> None:
    out = openrlhf.to_response([result(0.25), result(None, "error")], error_reward=-1.0)
    assert out["rewards"] == [0.25, -1.0] and out["scores"] == [0.25, -1.0]
    assert out["extra_logs"] == {"grm_error": [0.0, 1.0]}
    assert out["grm_errors"] == [None, "bad"]


def test_trl_standard_and_conversational_inputs() -> None:
    prompts = [[{"role": "system", "content": "s"}, {"role": "user", "content": "2+2?"}],
               "plain prompt"]
    completions = [[{"role": "assistant", "content": "4"}], "five"]
    image = Image.new("RGB", (8, 8), "white")
    items = trl.to_items(prompts, completions,
                         {"reference": ["4", "5"], "image": [image, None],
                          "completion_ids": [[1], [2]]}, trl.Job("judge"))
    assert [(i.prompt, i.completion, i.reference) for i in items] == [
        ("2+2?", "4", "4"), ("plain prompt", "five", "5")]
    assert isinstance(items[0].image, str) and items[0].image.startswith("data:image/png")
    assert items[1].image is None
    assert trl.rewards([result(0.5), result(None, "error")], "grm_judge") == [0.5, None]


def test_trl_images_column_and_images_in_the_prompt() -> None:
    image = Image.new("RGB", (8, 8), "white")
    columns = {"images": [[image, image], [image]], "reference": ["a", "b"]}
    items = trl.to_items(["p", "q"], ["x", "y"], columns, trl.Job("ocr"))
    assert isinstance(items[0].image, list) and len(items[0].image) == 2
    assert isinstance(items[1].image, str) and items[1].image.startswith("data:image/png")
    parts = [{"type": "image", "image": image}, {"type": "text", "text": "read this"}]
    prompt = [{"role": "user", "content": parts}]
    inline = trl.to_items([prompt, "plain"], ["x", "y"], {}, trl.Job("ocr"))
    assert isinstance(inline[0].image, str) and inline[1].image is None
    assert inline[0].prompt == "read this"
    named = trl.to_items(["p"], ["x"], {"shot": [image], "images": [None]},
                         trl.Job("ocr", image_key="shot"))
    assert isinstance(named[0].image, str)


def test_trl_failed_item_is_none_with_a_logged_reason(caplog: pytest.LogCaptureFixture) -> None:
    assert trl.rewards([result(None, "error")], "grm_judge") == [None]
    assert "grm_judge: sample 0 has no reward: bad" in caplog.text


def test_text_of_content_parts() -> None:
    parts = [{"type": "image"}, {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert common.text_of([{"role": "user", "content": parts}]) == "ab"


def test_reward_function_needs_a_url() -> None:
    with pytest.raises(common.ScoringError, match="GRM_SERVICE_URL"):
        trl.grm_reward(url=None)
    assert trl.grm_reward(url="http://x", scorer="judge").__name__ == "grm_judge"


def test_trl_reward_functions_are_plain_functions() -> None:
    # The forms every TRL release recognises: a def, and an `async def` for the async path.
    sync = trl.grm_reward("http://x", "judge", name="judge_sync")
    async_ = trl.async_grm_reward("http://x", "judge")
    assert inspect.isfunction(sync) and not inspect.iscoroutinefunction(sync)
    assert inspect.iscoroutinefunction(async_) and async_.__name__ == "grm_judge"
