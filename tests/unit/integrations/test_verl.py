"""The verl adapter fed the shapes verl really sends: samples, numpy ground truths."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from grm_service.integrations import verl
from grm_service.integrations.common import ScoringError, endpoint


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


async def test_verl_refuses_typos_and_keys_in_its_config() -> None:
    # verl binds reward_kwargs by keyword: a typo must fail by name, not be swallowed.
    with pytest.raises(TypeError, match="scorrer"):
        await verl.compute_score("s", "x", "4", {}, url="http://x", scorrer="judge")  # type: ignore[call-arg]
    with pytest.raises(ScoringError, match="GRM_API_KEY"):
        await verl.compute_score("s", "x", "4", {}, url="http://x", api_key="secret")
    with pytest.raises(ScoringError, match="GRM_API_KEY"):
        verl.compute_score_batch(["s"], ["x"], ["4"], [{}], url="http://x", api_key="secret")
    params = inspect.signature(verl.compute_score).parameters
    # What verl's reward managers add when they run a reward model of their own.
    assert {"reward_router_address", "reward_model_tokenizer"} <= set(params)
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())


async def test_close_clients_closes_the_batch_forms_clients_too() -> None:
    where = endpoint("http://x")
    first = verl._sync_client(where)
    assert verl._sync_client(where) is first  # one per endpoint, shared by every call
    await verl.close_clients()
    assert first._http.is_closed
    again = verl._sync_client(where)
    assert again is not first and not again._http.is_closed
    verl.close_batch_clients()
    assert again._http.is_closed
