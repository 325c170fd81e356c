"""The verl adapter fed the shapes verl really sends: samples, numpy ground truths."""

from __future__ import annotations

import inspect

import numpy as np

from grm_service.integrations import verl


def test_verl_sample_becomes_an_item() -> None:
    extra = {"split": "train", "index": 7, "question": "2+2?",
             "image": "data:image/png;base64,AAAA"}
    item = verl.to_item(3, "openai/gsm8k", "The answer is 4", "4", extra)
    assert (item.id, item.prompt, item.completion, item.reference) == (
        "3", "2+2?", "The answer is 4", "4")
    assert item.image == "data:image/png;base64,AAAA"
    assert item.extra == {"data_source": "openai/gsm8k"}
    assert verl.to_item(0, "s", "x", None, None).reference is None


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
