"""Reading a `/v1/score` body: envelope first, the item count capped before any item is
validated, items validated in chunks with errors placed at their index; and the schema."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from starlette.requests import Request

from grm_service.errors import InvalidJson, TooLarge
from grm_service.gateway.edge.score_body import CHUNK, add_score_schema, read_score_request
from grm_service.scoring.registry import OPTION_SCHEMAS


def request_of(raw: bytes) -> Request:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": "/v1/score", "headers": []},
                   receive)


async def read(body: Any, max_items: int = 10_000) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await read_score_request(request_of(raw), max_items)


async def test_a_valid_body_is_a_score_request() -> None:
    req = await read({"scorer": "judge", "items": [{"id": "a", "completion": "4"}],
                      "sampling": {"max_tokens": 3}, "options": {"min": 0}})
    assert (req.scorer, [i.id for i in req.items]) == ("judge", ["a"])
    assert (req.items[0].completion, req.sampling, req.options) == ("4", {"max_tokens": 3},
                                                                     {"min": 0})


async def test_the_item_count_is_capped_before_items_are_validated() -> None:
    with pytest.raises(TooLarge, match="3 items in one batch; the limit is 2"):
        await read({"scorer": "judge", "items": ["not", "an", "item"]}, max_items=2)


async def test_an_item_error_names_its_index_in_the_whole_batch() -> None:
    items: list[Any] = [{"id": str(i)} for i in range(CHUNK + 10)]
    items[CHUNK + 3] = {"completion": "no id"}
    with pytest.raises(RequestValidationError) as caught:
        await read({"scorer": "judge", "items": items})
    (error,) = caught.value.errors()
    assert error["loc"] == ("body", "items", CHUNK + 3, "id") and error["type"] == "missing"


async def test_a_body_that_is_not_json_is_refused_naming_where_and_what() -> None:
    with pytest.raises(InvalidJson, match=r"line 1, column 2 \(byte 1\): expected a property"):
        await read(b"{not json")


@pytest.mark.parametrize(("body", "loc", "kind"), [
    ({"scorer": "judge", "items": []}, ("body", "items"), "too_short"),
    ({"scorer": "judge", "items": [{"id": "a"}], "extra": 1}, ("body", "extra"),
     "extra_forbidden"),
    ({"scorer": "judge", "items": [{"id": "a"}, {"id": "a"}]}, ("body", "items"), "value_error"),
])
async def test_body_errors_keep_fastapis_shape(body: Any, loc: tuple[Any, ...], kind: str) -> None:
    with pytest.raises(RequestValidationError) as caught:
        await read(body)
    error = caught.value.errors()[0]
    assert (error["loc"], error["type"]) == (loc, kind)


def test_the_schema_enumerates_scorers_and_their_options() -> None:
    openapi: dict[str, Any] = {"paths": {"/v1/score": {"post": {}}}}
    add_score_schema(openapi, ["classify", "judge", "ocr", "mine"])
    schema = openapi["components"]["schemas"]["ScoreRequest"]
    assert schema["properties"]["scorer"]["enum"] == ["classify", "judge", "ocr", "mine"]
    titles = [option["title"] for option in schema["properties"]["options"]["anyOf"]]
    assert titles == [*OPTION_SCHEMAS, "custom scorer"]
    assert "max_tokens" in schema["properties"]["sampling"]["properties"]
    assert schema["properties"]["sampling"]["additionalProperties"] is False
    assert openapi["paths"]["/v1/score"]["post"]["requestBody"]["content"][
        "application/json"]["schema"] == {"$ref": "#/components/schemas/ScoreRequest"}
    assert "ScoreItem" in openapi["components"]["schemas"]
    builtin: dict[str, Any] = {"paths": {"/v1/score": {"post": {}}}}
    add_score_schema(builtin, list(OPTION_SCHEMAS))
    options = builtin["components"]["schemas"]["ScoreRequest"]["properties"]["options"]
    assert "custom scorer" not in [o["title"] for o in options["anyOf"]]
