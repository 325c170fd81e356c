"""The TRL adapter fed the shapes TRL really sends: standard and conversational, images."""

from __future__ import annotations

import inspect
import pickle

import pytest
from PIL import Image

from grm_service.integrations import common, trl
from grm_service.wire import ItemResult


def result(score: float | None, status: str = "ok") -> ItemResult:
    return ItemResult(id="0", score=score, status=status,  # type: ignore[arg-type]
                      error=None if status == "ok" else "bad", digest="d")


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


def test_reward_function_needs_a_url() -> None:
    with pytest.raises(common.ScoringError, match="GRM_SERVICE_URL"):
        trl.grm_reward(url=None)
    assert trl.grm_reward(url="http://x", scorer="judge").__name__ == "grm_judge"


def test_trl_reward_functions_are_picklable_callables() -> None:
    # AsyncGRPOTrainer pickles reward_funcs into a spawned process: closures cannot go.
    sync = trl.grm_reward("http://x", "judge", name="judge_sync", api_key="s3cret-key", timeout=5,
                          retries=0)
    async_ = trl.async_grm_reward("http://x", "judge")
    assert not inspect.iscoroutinefunction(sync.__call__)
    assert inspect.iscoroutinefunction(async_.__call__) and async_.__name__ == "grm_judge"
    for fn in (sync, async_):
        copy = pickle.loads(pickle.dumps(fn))
        assert copy == fn and copy.__name__ == fn.__name__
    assert "s3cret" not in repr(sync), "the key is never in a printed reward function"
    assert sync.where.timeout == 5 and sync.where.retries == 0


def test_fingerprints_and_errors_go_to_trls_log_hooks() -> None:
    results = [ItemResult(id="0", score=1.0, status="ok", digest="d"),
               ItemResult(id="1", score=None, status="error", error="bad", digest="d")]
    extra: dict[str, list[object]] = {}
    metrics: dict[str, float] = {}
    trl.report(results, "grm_judge", {"log_extra": extra.__setitem__,
                                      "log_metric": metrics.__setitem__})
    assert extra == {"grm_judge/grm_fingerprint": ["", ""], "grm_judge/grm_error": ["", "bad"]}
    assert metrics == {"grm_judge/grm_error_rate": 0.5}
    trl.report(results, "grm_judge", {})  # TRL's async trainer passes neither


def test_trl_generated_images_are_scored_against_their_prompts() -> None:
    shots = [Image.new("RGB", (8, 8), c) for c in ("white", "black")]
    prompts = [[{"role": "user", "content": "a white square"}], "a black square"]
    items = trl.to_items(prompts, shots, {"completion_ids": [[1], [2]]},
                         trl.Job("clip", generated_images=True))
    assert [(i.prompt, i.completion) for i in items] == [("a white square", None),
                                                         ("a black square", None)]
    assert all(isinstance(i.image, str) and i.image.startswith("data:image/png") for i in items)
    assert items[0].image != items[1].image
    named = trl.to_items(["p"], ["ignored text"], {"shot": [shots[0]]},
                         trl.Job("reward_head", image_key="shot", generated_images=True))
    assert named[0].image == items[0].image
    reward = trl.async_grm_image_reward(url="http://x", scorer="reward_head")
    assert reward.__name__ == "grm_reward_head" and reward.job.generated_images
    assert pickle.loads(pickle.dumps(reward)).job == reward.job
