"""What the ledger keeps of one answered request, and who asked for it."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from grm_service.digits import INT64_MAX, decimal
from grm_service.errors import BadTag
from grm_service.fingerprint import digest
from grm_service.headers import RUN_HEADER, STEP_HEADER

# msgspec, not json.dumps: nearly half of the writer's time per record went to `json.dumps`
# building an encoder each call (benchmarks/RESULTS.md, issue 20). The text reads back the same.
_FIELDS_JSON = msgspec.json.Encoder()
# The fingerprint's members kept as columns: `fields_json` leaves them out, `full_fields` puts
# them back.
IN_COLUMNS = frozenset({"fingerprint_id", "request_digest", "response_digest"})
_ROW_BYTES = 400  # what a record's columns take besides its body and payload, about
_MAX_RUN = 200
# Origins kept (`Origin.of`): a trainer sends a few keys, one run and a step at a time, so nearly
# every request finds its origin made, the key's digest and the frozen dataclass's slow
# `__init__` (~0.5 us) done once.
_ORIGINS = 4096


def key_id(token: bytes | None) -> str:
    """A digest of the presented API key (never the key): "" where none was presented."""
    return "key-" + digest(token, 16) if token else ""


def parse_run(raw: str | None) -> str | None:
    if raw is None or raw == "":
        return None
    if len(raw) > _MAX_RUN or not raw.isprintable():
        raise BadTag(f"{RUN_HEADER} must be printable and at most {_MAX_RUN} characters")
    return raw


def parse_step(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    step = decimal(raw)
    if step is None:
        raise BadTag(f"{STEP_HEADER} must be an integer from 0 to {INT64_MAX} in ASCII digits "
                     f"(e.g. '{STEP_HEADER}: 12'), not {raw[:40]!r}")
    return step


@dataclass(frozen=True, slots=True)
class Origin:
    """Who asked, and under which tags; `route` is the client's route (the cache's policy)."""

    route: str
    key_id: str = ""
    run: str | None = None
    step: int | None = None

    @classmethod
    def of(cls, route: str, token: bytes | None, run: str | None, step: str | None) -> Origin:
        """From the request's presented key (`admission.presented_key`) and tag headers; a bad
        tag raises `BadTag` (never kept, so raised every time)."""
        return _origin(route, token, run, step)


@functools.lru_cache(maxsize=_ORIGINS)
def _origin(route: str, token: bytes | None, run: str | None, step: str | None) -> Origin:
    return Origin(route, key_id(token), parse_run(run), parse_step(step))


@dataclass
class Record:
    """One answered request. `body` is the canonical request as sent to the engine (None:
    digests only); `payload` the engine's answer as JSON bytes; `fields` the fingerprint."""

    at: float
    origin: Origin
    path: str
    fingerprint_id: str
    request_digest: str
    response_digest: str
    body: bytes | None
    payload: bytes
    fields: dict[str, Any]
    cache: str = ""  # "", "hit" or "coalesced"
    id: int | None = field(default=None, compare=False)
    # Whether the cache may look it up (its route's policy when it was answered): only those
    # records are in the lookup index, which every other record would pay for on its write.
    indexed: bool = field(default=True, compare=False)

    @property
    def size(self) -> int:
        return record_size(self.body, self.payload)


def record_size(body: bytes | None, payload: bytes) -> int:
    """What a record takes in the store, about: the bound on the ledger's size counts these."""
    return len(body or b"") + len(payload) + _ROW_BYTES


def fields_json(fields: Mapping[str, Any]) -> str:
    """The fingerprint as a record's `fields` text: without the members that are columns of
    their own (`IN_COLUMNS`), which would repeat ~200 bytes of every record on disk."""
    return _FIELDS_JSON.encode({k: v for k, v in fields.items() if k not in IN_COLUMNS}).decode()


def full_fields(text: str, fingerprint_id: str, request_digest: str,
                response_digest: str) -> dict[str, Any]:
    """The fingerprint of a record's `fields` text and its columns, in `Fingerprint`'s order
    (the order an answer served again renders them in). A record of an earlier version, which
    kept them in the text too, reads back the same."""
    rest = json.loads(text)
    cache = rest.pop("cache", None)
    fields = {"fingerprint_id": fingerprint_id, **rest, "request_digest": request_digest,
              "response_digest": response_digest}
    if cache is not None:
        fields["cache"] = cache
    return fields
