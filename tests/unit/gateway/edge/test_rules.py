"""The hot routes' body rules are derived from the pydantic schemas, so they cannot drift: a
field added to a schema is held to its constraints on the hot path too (a table written by hand
once forwarded `n: 0` where FastAPI answered 422), a schema feature the fast check cannot mirror
fails when the rules are built, and a body the fast check does not take gets pydantic's own
answer: the same value, or the same 422.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field, ValidationError, field_validator

from grm_service.config import Settings
from grm_service.gateway.edge.rules import (
    CHAT_RULES,
    CLASSIFY_RULES,
    BodyRules,
    NotPlain,
    Unbound,
)
from grm_service.gateway.edge.schemas import ChatCompletionRequest, ClassifyRequest
from tests.support.gateway import client, received, serving
from tests.support.procs import Proc
from tests.unit.gateway.edge.test_hotpath import BODIES

MSGS = [{"role": "user", "content": "hi"}]


class WithN(ChatCompletionRequest):
    n: int = Field(1, ge=1)


def pydantic_answer(model: type[BaseModel], body: Any) -> Any:
    try:
        validated = model.model_validate(body, from_attributes=True)  # as FastAPI does
        return validated.model_dump(exclude_unset=True, mode="json")
    except ValidationError as err:
        return err.errors(include_url=False)


def rules_answer(rules: BodyRules, body: Any) -> Any:
    try:
        return rules.apply(body)
    except ValidationError as err:
        return err.errors(include_url=False)


@pytest.mark.parametrize(("rules", "model"), [(CHAT_RULES, ChatCompletionRequest),
                                              (CLASSIFY_RULES, ClassifyRequest)])
def test_every_field_of_the_schema_has_its_check(rules: BodyRules,
                                                 model: type[BaseModel]) -> None:
    assert rules.checks.keys() == model.model_fields.keys()
    assert rules.required == {n for n, f in model.model_fields.items() if f.is_required()}


def test_a_field_added_to_the_schema_is_held_to_its_constraint() -> None:
    rules = BodyRules.of(WithN)
    with pytest.raises(NotPlain):
        rules.fast({"messages": MSGS, "n": 0})
    with pytest.raises(ValidationError) as refused:
        rules.apply({"messages": MSGS, "n": 0})
    assert refused.value.errors()[0]["loc"] == ("n",)
    assert rules.fast({"messages": MSGS, "n": 2}) == {"messages": MSGS, "n": 2}
    for body in ({"messages": MSGS, "n": 0}, {"messages": MSGS, "n": "3"},
                 {"messages": MSGS, "n": True}, {"messages": MSGS, "n": 2**64}):
        assert rules_answer(rules, body) == pydantic_answer(WithN, body), body


@pytest.mark.parametrize("body", [*BODIES, {"messages": MSGS, "n": 0}], ids=range(len(BODIES) + 1))
def test_the_rules_answer_what_pydantic_answers(body: Any) -> None:
    assert rules_answer(CHAT_RULES, body) == pydantic_answer(ChatCompletionRequest, body)
    assert rules_answer(CLASSIFY_RULES, body) == pydantic_answer(ClassifyRequest, body)


class Validated(ChatCompletionRequest):
    @field_validator("model")
    @classmethod
    def lower(cls, value: str | None) -> str | None:
        return value.lower() if value else value


class Aliased(ChatCompletionRequest):
    best: int | None = Field(None, alias="best_of")


class Stepped(ChatCompletionRequest):
    n: int = Field(1, multiple_of=2)


class Typed(ChatCompletionRequest):
    stop: set[str] | None = None


class Closed(ChatCompletionRequest, extra="forbid"):
    pass


@pytest.mark.parametrize("model", [Validated, Aliased, Stepped, Typed, Closed])
def test_a_schema_the_rules_cannot_mirror_fails_when_they_are_built(
    model: type[BaseModel],
) -> None:
    with pytest.raises(Unbound):
        BodyRules.of(model)


@pytest.mark.parametrize("body", [
    {"messages": []}, {"messages": MSGS, "top_p": 0}, {"messages": MSGS, "max_tokens": "x"},
    {"messages": MSGS, "seed": -1}, {"messages": MSGS, "stream": True}, [1], {"seed": 1},
], ids=["empty", "top_p", "max_tokens", "seed", "stream", "list", "no-messages"])
async def test_a_refusal_on_the_hot_path_is_the_routes_answer(stub: Proc, tmp_path: Path,
                                                              body: Any) -> None:
    settings = Settings(replica_urls=[stub.url], served_model_name="rm", work_dir=tmp_path)
    async with serving(settings) as (hot, _), client(hot.app) as route, client(hot) as fast:
        slow = await route.post("/v1/chat/completions", json=body)
        quick = await fast.post("/v1/chat/completions", json=body)
        await received(stub.url)
    assert 400 <= slow.status_code < 500
    assert (quick.status_code, quick.content, quick.headers) == (
        slow.status_code, slow.content, slow.headers)
