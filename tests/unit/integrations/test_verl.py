"""The verl adapter fed the shapes verl really sends: samples, numpy ground truths."""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

import httpx
import numpy as np
import pytest

from grm_service.client import AsyncGrmClient
from grm_service.integrations import verl, verl_groups
from grm_service.integrations.common import ScoringError, endpoint
from grm_service.integrations.microbatch import MicroBatcher
from grm_service.wire import ScoreItem


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


def test_a_sample_with_a_group_is_sent_with_it() -> None:
    extra = {"question": "2+2?", "group_id": "uid-1", "group_size": np.int64(8)}
    item = verl.to_item(0, "s", "4", "4", extra)
    assert (item.group_id, item.group_size) == ("uid-1", 8)
    assert type(item.group_size) is int
    assert (verl.to_item(0, "s", "4", "4", {}).group_id, verl.to_item(0, "s", "4", "4", {})
            .group_size) == (None, None)


class Rows:
    """What `with_groups` reads of a verl DataProto: its `non_tensor_batch`."""

    def __init__(self, non_tensor_batch: dict[str, np.ndarray]) -> None:
        self.non_tensor_batch = non_tensor_batch


def test_each_sample_gets_its_group_in_an_extra_info_of_its_own() -> None:
    shared = {"index": 0}
    rows = Rows({"uid": np.array(["a", "a", "b"], dtype=object),
                 "extra_info": np.array([shared, shared, None], dtype=object)})
    verl_groups.with_groups(rows, 2)
    infos = list(rows.non_tensor_batch["extra_info"])
    assert infos == [{"index": 0, "group_id": "a", "group_size": 2},
                     {"index": 0, "group_id": "a", "group_size": 2},
                     {"group_id": "b", "group_size": 2}]
    assert infos[0] is not infos[1] and shared == {"index": 0}
    bare = Rows({"uid": np.array(["c"], dtype=object)})
    verl_groups.with_groups(bare, 4)
    assert list(bare.non_tensor_batch["extra_info"]) == [{"group_id": "c", "group_size": 4}]


def test_the_group_manager_is_looked_up_by_name_only() -> None:
    with pytest.raises(AttributeError, match="Nothing"):
        _ = verl_groups.Nothing  # type: ignore[attr-defined]


async def test_a_grouped_call_keeps_its_own_id_in_the_batch() -> None:
    """The service tells a held group's items apart by id, across batches: the batcher's
    renumbering ("0", "1", ...) would make two workers' items one conflicting item."""
    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        items = json.loads(request.content)["items"]
        sent.extend(items)
        results = [{"id": i["id"], "score": 0.5, "status": "ok", "digest": "d"} for i in items]
        return httpx.Response(200, json={"results": results, "fingerprint": {
            "fingerprint_id": "f", "scorer": "s", "items": len(results), "errors": 0,
            "digest": "d"}})

    client = AsyncGrmClient("http://x", transport=httpx.MockTransport(answer))
    batcher = MicroBatcher(client, "listwise", {}, {}, max_items=3, wait_s=0.01)
    items = [ScoreItem(id="0", completion="a"),
             ScoreItem(id="u-1", completion="b", group_id="g", group_size=2),
             ScoreItem(id="u-2", completion="b", group_id="g", group_size=2)]
    await asyncio.gather(*(batcher.score(i) for i in items))
    await client.aclose()
    assert [(i["id"], i.get("group_id"), i.get("group_size")) for i in sent] == [
        ("0", None, None), ("u-1", "g", 2), ("u-2", "g", 2)]
