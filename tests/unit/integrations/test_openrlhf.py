"""The OpenRLHF adapter: queries split into prompt and response, special tokens, answers."""

from __future__ import annotations

import pytest

from grm_service.integrations import openrlhf
from grm_service.wire import ItemResult


def result(score: float | None, status: str = "ok") -> ItemResult:
    return ItemResult(id="0", score=score, status=status,  # type: ignore[arg-type]
                      error=None if status == "ok" else "bad", digest="d")


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
    ("<|endoftext|> <|im_end|>", "A!"),  # `+` in a URL: it survives OpenRLHF's comma split
    (["<|endoftext|>", "<|im_end|>"], "A!"),  # the parameter repeated
    # A comma is no separator (a %2C-encoded one may be part of a token).
    ("<|endoftext|>,<|im_end|>", "A!<|im_end|><|endoftext|>"),
])
def test_openrlhf_special_tokens_are_stripped_as_asked(special_tokens: str | list[str],
                                                       completion: str) -> None:
    prompt = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    req = openrlhf.RewardRequest(query=[prompt + "A!<|im_end|><|endoftext|>"], prompts=[prompt])
    assert openrlhf.to_items(req, special_tokens)[0].completion == completion


def test_openrlhf_other_templates_tokens() -> None:
    for query in ("A!<eos>", "A!<end_of_turn>", "A!</s>", "A!<|eot_id|>"):
        assert openrlhf.to_items(openrlhf.RewardRequest(query=[query]))[0].completion == "A!"
    for bad in (" ", [], "auto </s>", ["keep", "</s>"]):
        with pytest.raises(ValueError, match="special_tokens"):
            openrlhf.token_pattern(bad)


def test_a_url_that_openrlhf_would_cut_is_named() -> None:
    assert openrlhf.cut_by_openrlhf("scorer=judge&special_tokens=%3C%2Fs%3E%2Cx") is None
    reason = openrlhf.cut_by_openrlhf("scorer=judge&special_tokens=<|im_end|>,</s>")
    assert reason is not None and "splits --reward.remote_url on commas" in reason


def test_openrlhf_response_shape() -> None:
    out = openrlhf.to_response([result(0.25), result(None, "error")], error_reward=-1.0)
    assert out["rewards"] == [0.25, -1.0] and out["scores"] == [0.25, -1.0]
    assert out["extra_logs"] == {"grm_error": [0.0, 1.0]}
    assert out["grm_errors"] == [None, "bad"]
