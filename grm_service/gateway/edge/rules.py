"""The body rules of the hot routes, derived from their pydantic schemas (`schemas.py`): one
table, so the fast check cannot drift from the model FastAPI validates with.

`BodyRules.fast` returns what `model.model_validate(body).model_dump(exclude_unset=True,
mode="json")` returns, for bodies whose fields all have their plain JSON types and meet the
schema's bounds, without building the model; any other body goes to `validated`, pydantic
itself, so a refusal is pydantic's 422 word for word. A schema feature the table cannot mirror
(a validator, an alias, a constraint or a type not listed here) fails at import, naming it.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import annotated_types as at
from pydantic import BaseModel

from grm_service.gateway.edge.schemas import ChatCompletionRequest, ClassifyRequest

_INT64 = 2**63 - 1
_EXACT_FLOAT = 2**53  # ints pydantic turns into floats without rounding

Check = Callable[[Any], Any]


class NotPlain(Exception):
    """A body the fast check does not take on: pydantic decides."""


class Unbound(TypeError):
    """A schema the table cannot mirror."""


@dataclass(frozen=True)
class Bounds:
    ge: float = -math.inf
    gt: float = -math.inf
    le: float = math.inf
    lt: float = math.inf
    min_length: int = 0

    def ok(self, value: float) -> bool:
        return self.ge <= value <= self.le and self.gt < value < self.lt


def _bounds(name: str, metadata: list[Any]) -> Bounds:
    found: dict[str, Any] = {}
    for item in metadata:
        if isinstance(item, at.Ge | at.Gt | at.Le | at.Lt | at.MinLen):
            found.update(dataclasses.asdict(item))
        else:
            raise Unbound(f"{name}: constraint {item!r} has no fast check")
    return Bounds(**found)


def _int(bounds: Bounds, optional: bool) -> Check:
    def check(value: Any) -> Any:
        if value is None and optional:
            return None
        # bool is an int subclass: pydantic words its refusal
        if type(value) is not int or not bounds.ok(value) or abs(value) > _INT64:
            raise NotPlain
        return value
    return check


def _float(bounds: Bounds, optional: bool) -> Check:
    def check(value: Any) -> Any:
        if value is None and optional:
            return None
        if type(value) is int and abs(value) <= _EXACT_FLOAT:
            value = float(value)  # pydantic turns 1 into 1.0, and the canonical JSON shows it
        if type(value) is not float or not bounds.ok(value):
            raise NotPlain
        return value
    return check


def _typed(kind: type, optional: bool) -> Check:
    def check(value: Any) -> Any:
        if type(value) is not kind and not (value is None and optional):
            raise NotPlain
        return value
    return check


def _list_of_dicts(bounds: Bounds, optional: bool) -> Check:
    def check(value: Any) -> Any:
        if value is None and optional:
            return None
        if type(value) is not list or len(value) < bounds.min_length:
            raise NotPlain
        for item in value:  # a loop, not any(...): no generator per body
            if type(item) is not dict:
                raise NotPlain
        return value
    return check


def _check_for(name: str, annotation: Any, bounds: Bounds, optional: bool = False) -> Check:
    if annotation is Any:
        return lambda value: value  # kept as sent: pydantic's Any is the value itself
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [arg for arg in args if arg is not type(None)]
        return _check_for(name, inner, bounds, optional=True)
    if annotation is int:
        return _int(bounds, optional)
    if annotation is float:
        return _float(bounds, optional)
    if annotation in (str, bool) and bounds == Bounds():
        return _typed(annotation, optional)
    if typing.get_origin(annotation) is list and args and typing.get_origin(args[0]) is dict:
        return _list_of_dicts(bounds, optional)
    raise Unbound(f"{name}: type {annotation!r} has no fast check")


@dataclass(frozen=True)
class BodyRules:
    model: type[BaseModel]
    checks: dict[str, Check]
    required: frozenset[str]

    @classmethod
    def of(cls, model: type[BaseModel]) -> BodyRules:
        decorators = model.__pydantic_decorators__
        hooks = (decorators.validators, decorators.field_validators, decorators.root_validators,
                 decorators.model_validators, decorators.field_serializers,
                 decorators.model_serializers)
        if any(hooks) or model.model_config.get("extra") != "allow":
            raise Unbound(f"{model.__name__}: validators, serializers or closed extras "
                          "have no fast check")
        checks, required = {}, set()
        for name, info in model.model_fields.items():
            if info.alias or info.validation_alias or info.serialization_alias:
                raise Unbound(f"{model.__name__}.{name}: an alias has no fast check")
            checks[name] = _check_for(name, info.annotation, _bounds(name, info.metadata))
            if info.is_required():
                required.add(name)
        return cls(model, checks, frozenset(required))

    def fast(self, body: Any) -> dict[str, Any]:
        if type(body) is not dict:
            raise NotPlain
        for name in self.required:
            if name not in body:
                raise NotPlain
        checks = self.checks
        out = dict(body)
        for name, value in body.items():
            check = checks.get(name)
            if check is not None:
                out[name] = check(value)
        return out

    def validated(self, body: Any) -> dict[str, Any]:
        """pydantic's answer, validated as FastAPI validates a body; its ValidationError is the
        caller's 422."""
        model = self.model.model_validate(body, from_attributes=True)
        return model.model_dump(exclude_unset=True, mode="json")

    def apply(self, body: Any) -> dict[str, Any]:
        try:
            return self.fast(body)
        except NotPlain:
            return self.validated(body)


CHAT_RULES = BodyRules.of(ChatCompletionRequest)
CLASSIFY_RULES = BodyRules.of(ClassifyRequest)
