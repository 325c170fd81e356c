"""The records of `POST /v1/score` as a client holds them: plain dataclasses over JSON.

The client and the trainers' adapters use these, so that a trainer's environment needs the
standard library and httpx alone. The server's pydantic models (`grm_service.scoring.models`,
`grm_service.fingerprint.Fingerprint`) stay the schema the gateway validates; these mirror their
field names and which fields are required (tests/unit/test_wire.py binds each pair and checks
that an answer the server writes reads back and writes out unchanged). Nothing is validated
here beyond the fields' names: the service answers a bad item with a 400 that says what to fix.

Reading an answer drops a field this release does not know (a newer service keeps working with
an older client); a field a record requires and lacks is a ValueError.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


def _fields(cls: type[Any], data: Mapping[str, Any], known_only: bool) -> dict[str, Any]:
    """`data`'s fields of record `cls`; ValueError for a required one missing, or (unless
    `known_only`) for a field the record does not have."""
    if not isinstance(data, Mapping):
        raise ValueError(f"a {cls.__name__} is a JSON object, not {type(data).__name__}")
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown and not known_only:
        raise ValueError(f"{cls.__name__} has no field {', '.join(map(repr, unknown))}; its "
                         f"fields are {', '.join(names)}")
    missing = [name for name, f in names.items() if name not in data and _required(f)]
    if missing:
        raise ValueError(f"{cls.__name__} lacks {', '.join(missing)}")
    return {key: value for key, value in data.items() if key in names}


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


@dataclass(frozen=True, kw_only=True)
class ScoreItem:
    """One thing to score. `image` is a data URL or bare base64; a list of them is video frames."""

    id: str
    image: str | list[str] | None = None
    prompt: str | None = None
    completion: str | None = None  # the text judged (a policy's answer): judge, classify
    reference: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    group_id: str | None = None  # group scorers: the items judged together
    group_size: int | None = None  # group scorers: how many items the group has

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScoreItem:
        """An item from a mapping of its fields; ValueError for a field items do not have."""
        return cls(**_fields(cls, data, known_only=False))

    def to_json(self) -> dict[str, Any]:
        """The item as sent: the fields left None are omitted."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}


@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    """One answer's fingerprint: the serving replica's identity for this seed, and the digests
    of what was asked and answered (`grm_service.fingerprint.Fingerprint` says more)."""

    fingerprint_id: str
    identity: str
    seed: int
    model_hash: str | None
    env_digest: str | None
    engine: str
    engine_version: str
    device: str | None
    tensor_parallel_size: int | None = None
    replica: str
    serialized: bool
    request_digest: str
    response_digest: str
    cache: str | None = None  # "hit" or "coalesced"; absent from the JSON where computed

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fingerprint:
        return cls(**_fields(cls, data, known_only=True))

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if out["cache"] is None:
            del out["cache"]
        return out


@dataclass(frozen=True, kw_only=True)
class ItemResult:
    """One item's answer: its score, or `status == "error"` and why."""

    id: str
    score: float | None
    status: Literal["ok", "error"]
    error: str | None = None
    response: str | list[str] | None = None
    fingerprint: Fingerprint | None = None
    digest: str  # of id, status, score and the fingerprint's digests

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ItemResult:
        fields = _fields(cls, data, known_only=True)
        if fields.get("score") is not None:
            fields["score"] = float(fields["score"])
        if fields.get("fingerprint") is not None:
            fields["fingerprint"] = Fingerprint.from_json(fields["fingerprint"])
        return cls(**fields)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["fingerprint"] = self.fingerprint.to_json() if self.fingerprint else None
        return out


@dataclass(frozen=True, kw_only=True)
class BatchFingerprint:
    fingerprint_id: str
    scorer: str
    items: int
    errors: int
    digest: str  # over the item digests, in input order

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BatchFingerprint:
        return cls(**_fields(cls, data, known_only=True))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class ScoreResponse:
    results: list[ItemResult]
    fingerprint: BatchFingerprint

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScoreResponse:
        fields = _fields(cls, data, known_only=True)
        results = fields["results"]
        if not isinstance(results, list):
            raise ValueError(f"ScoreResponse results is a list, not {type(results).__name__}")
        return cls(results=[ItemResult.from_json(r) for r in results],
                   fingerprint=BatchFingerprint.from_json(fields["fingerprint"]))

    def to_json(self) -> dict[str, Any]:
        return {"results": [r.to_json() for r in self.results],
                "fingerprint": self.fingerprint.to_json()}
