"""The client's records (`grm_service.wire`) against the server's schema of `/v1/score`: the
same fields, in the same order, required alike; an answer the server writes reads back and
writes out unchanged; an item the client sends is one the server accepts as it is."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from pydantic import BaseModel

from grm_service import fingerprint, wire
from grm_service.gateway.edge.routes_integrations import RewardBody
from grm_service.integrations import openrlhf
from grm_service.scoring import models

PAIRS: list[tuple[type[Any], type[BaseModel]]] = [
    (wire.ScoreItem, models.ScoreItem), (wire.ItemResult, models.ItemResult),
    (wire.BatchFingerprint, models.BatchFingerprint), (wire.ScoreResponse, models.ScoreResponse),
    (wire.Fingerprint, fingerprint.Fingerprint), (openrlhf.RewardRequest, RewardBody),
]


def shape_of_dataclass(cls: type[Any]) -> list[tuple[str, bool]]:
    return [(f.name, f.default is dataclasses.MISSING
             and f.default_factory is dataclasses.MISSING) for f in dataclasses.fields(cls)]


def shape_of_model(model: type[BaseModel]) -> list[tuple[str, bool]]:
    return [(name, f.is_required()) for name, f in model.model_fields.items()]


@pytest.mark.parametrize(("record", "model"), PAIRS, ids=lambda c: c.__qualname__)
def test_same_fields_in_the_same_order_required_alike(
    record: type[Any], model: type[BaseModel]
) -> None:
    assert shape_of_dataclass(record) == shape_of_model(model)


def served_fingerprint(cache: str | None) -> fingerprint.Fingerprint:
    return fingerprint.Fingerprint(
        fingerprint_id="grm-1", identity="verified", seed=7, model_hash="blake3:m",
        env_digest=None, engine="vllm", engine_version="0.1", device="cpu", replica="r0",
        serialized=True, request_digest="q", response_digest="a", cache=cache)


def served_answer() -> models.ScoreResponse:
    results = [
        models.ItemResult(id="a", score=0.25, status="ok", response="HÉLLO",
                          fingerprint=served_fingerprint(None), digest="d1"),
        models.ItemResult(id="b", score=1.0, status="ok", response=["A", "B"],
                          fingerprint=served_fingerprint("hit"), digest="d2"),
        models.ItemResult(id="c", score=None, status="error", error="bad image", digest="d3"),
    ]
    batch = models.BatchFingerprint(fingerprint_id="grm-1", scorer="ocr", items=3, errors=1,
                                    digest="b")
    return models.ScoreResponse(results=results, fingerprint=batch)


def test_an_answer_reads_back_and_writes_out_unchanged() -> None:
    sent = json.loads(served_answer().model_dump_json())
    read = wire.ScoreResponse.from_json(sent)
    assert read.results[0].fingerprint == wire.Fingerprint(**sent["results"][0]["fingerprint"])
    assert "cache" not in sent["results"][0]["fingerprint"]  # absent where computed
    assert read.results[1].fingerprint is not None and read.results[1].fingerprint.cache == "hit"
    assert read.to_json() == sent


def test_a_result_line_is_the_servers_json() -> None:
    # `grm-service score` writes these lines (commands/results.py).
    for result in served_answer().results:
        line = json.dumps(wire.ItemResult.from_json(json.loads(result.model_dump_json()))
                          .to_json(), ensure_ascii=False, separators=(",", ":"))
        assert line == result.model_dump_json()


def test_a_newer_servers_field_is_dropped_a_missing_one_named() -> None:
    sent = json.loads(served_answer().model_dump_json())
    sent["results"][0]["later"] = 1
    sent["results"][0]["fingerprint"]["later"] = 2
    assert wire.ScoreResponse.from_json(sent).results[0].id == "a"
    del sent["results"][2]["digest"]
    with pytest.raises(ValueError, match="ItemResult lacks digest"):
        wire.ScoreResponse.from_json(sent)


def test_an_item_the_client_sends_is_one_the_server_accepts_as_is() -> None:
    item = wire.ScoreItem(id="x", image=["data:image/png;base64,AA"], completion="4",
                          extra={"references": ["4", "four"]})
    sent = item.to_json()
    assert "prompt" not in sent and "reference" not in sent  # None is not sent
    assert models.ScoreItem.model_validate(sent).model_dump(exclude_none=True) == sent
    assert wire.ScoreItem.from_json(sent) == item


def test_an_unknown_item_field_is_named() -> None:
    with pytest.raises(ValueError, match="ScoreItem has no field 'imgae'"):
        wire.ScoreItem.from_json({"id": "x", "imgae": "data:..."})
    with pytest.raises(ValueError, match="ScoreItem lacks id"):
        wire.ScoreItem.from_json({"image": "data:..."})


@pytest.mark.parametrize(("answer", "why"), [
    ([], "ScoreResponse is a JSON object, not list"),
    ({"results": {}, "fingerprint": {}}, "ScoreResponse results is a list, not dict"),
    ({"results": ["a"], "fingerprint": {}}, "ItemResult is a JSON object, not str"),
])
def test_an_answer_of_another_shape_is_named(answer: Any, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        wire.ScoreResponse.from_json(answer)
