"""Reading a `POST /v1/score` body without holding the event loop, and its OpenAPI schema.

FastAPI would validate a whole batch in one pydantic call: 100,000 items are half a second in
which no other request (not even `/health`) is served. Here the envelope is validated first, the
item count is capped before any item is (a refused batch costs its JSON parse only), and the
items are validated in chunks with the loop free in between. Errors keep FastAPI's 422 shape.

The schema is the app's own: scorer names and each built-in scorer's options enumerated, so
clients and the schema fuzzer see what is accepted.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from grm_service.errors import TooLarge
from grm_service.gateway.edge.bad_json import invalid_json
from grm_service.gateway.request.checkpoint import SAMPLING_FIELDS
from grm_service.scoring.models import ScoreItem, ScoreRequest
from grm_service.scoring.registry import OPTION_SCHEMAS

CHUNK = 1000
_ITEMS = TypeAdapter(list[ScoreItem])


class _Envelope(BaseModel):
    """ScoreRequest with its items still raw."""

    model_config = ConfigDict(extra="forbid")

    scorer: str = Field(min_length=1)
    items: list[Any] = Field(min_length=1)
    sampling: dict[str, Any] = Field(default_factory=dict)
    options: dict[str, Any] = Field(default_factory=dict)


def _invalid(err: ValidationError, items_from: int | None = None) -> RequestValidationError:
    """FastAPI's 422 for a body error; `items_from`: the error is in the chunk starting there."""
    errors = []
    for e in err.errors(include_url=False):
        loc = tuple(e["loc"])
        if items_from is not None:
            loc = ("items", items_from + int(loc[0]), *loc[1:])
        errors.append({**e, "loc": ("body", *loc)})
    return RequestValidationError(errors)


async def read_score_request(request: Request, max_items: int) -> ScoreRequest:
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise invalid_json(raw) from None
    try:
        envelope = _Envelope.model_validate(data)
    except ValidationError as err:
        raise _invalid(err) from None
    if len(envelope.items) > max_items:
        raise TooLarge(f"{len(envelope.items)} items in one batch; the limit is {max_items} "
                       "(GRM_MAX_SCORE_ITEMS): split the batch")
    items: list[ScoreItem] = []
    for start in range(0, len(envelope.items), CHUNK):
        try:
            items += _ITEMS.validate_python(envelope.items[start:start + CHUNK])
        except ValidationError as err:
            raise _invalid(err, items_from=start) from None
        await asyncio.sleep(0)
    try:
        return ScoreRequest(scorer=envelope.scorer, items=items, sampling=envelope.sampling,
                            options=envelope.options)
    except ValidationError as err:
        raise _invalid(err) from None


def add_score_schema(openapi: dict[str, Any], scorers: list[str]) -> None:
    """Put ScoreRequest (scorer names, options per built-in scorer) into the app's schema."""
    defs: dict[str, Any] = {}
    schema = ScoreRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    defs.update(schema.pop("$defs", {}))
    schema["properties"]["scorer"]["enum"] = scorers
    options = [{"title": name, **shape} for name, shape in OPTION_SCHEMAS.items()]
    if set(scorers) - set(OPTION_SCHEMAS):
        options.append({"title": "custom scorer", "type": "object"})
    schema["properties"]["options"] = {"anyOf": options, "default": {}}
    schema["properties"]["sampling"] = {
        "type": "object", "additionalProperties": False, "default": {},
        "description": "Overrides of the scorer's sampling; only these fields.",
        "properties": {name: {} for name in sorted(SAMPLING_FIELDS)}}
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    components.update(defs)
    components["ScoreRequest"] = schema
    body = {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/ScoreRequest"}}}}
    openapi["paths"]["/v1/score"]["post"]["requestBody"] = body
