"""A forwarded request's answer: the engine's payload and its fingerprint, as the API sends it.

    stamps = Stamps()                                   # one per gateway
    fields = fingerprint_fields(stamp, alone, parts_digest(raw), payload)
    answer = Forwarded(payload, fields, stamp.system, stamp.json)
    wrap(answer) -> dict     render(answer) -> bytes (the same dict as JSON)

The fingerprint's fields are kept as a dict in `Fingerprint`'s field order: the hot path renders
them without building (and dumping) the pydantic model; `Forwarded.fingerprint` builds it for the
callers that want one. Most fields are fixed by the replica's identity and the seed (a `Stamp`,
computed and rendered once per pair); only three change per answer.

An engine's answer is JSON already, and rendering it again is most of a long answer's cost
(~130 us for 128 tokens with logprobs). Where the engine's bytes are known to be strict JSON of
the payload (`Forwarded.engine_json`), `render` keeps them and rewrites only their end: the
members from `system_fingerprint` on are re-rendered with the gateway's value, and the
fingerprint is appended. That end is checked against the payload's own members, so the answer
parses to `wrap(answer)` always, and for vLLM, which writes starlette's compact JSON, it is the
same bytes (`tests/unit/gateway/request/test_answer.py`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from grm_service.engine_side.identity import ReplicaIdentity
from grm_service.fingerprint import Fingerprint, response_digest, stamp_headers

# Byte for byte what starlette's JSONResponse renders (`json.dumps` with these options), built
# once instead of per call. No circular-reference check: what is rendered is parsed JSON and
# strings, which cannot contain a cycle (the check costs a lookup per container).
RESPONSE_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, indent=None,
                                 separators=(",", ":"), check_circular=False)
# What `RESPONSE_JSON.encode` returns for a str, without its Python wrapper (~0.4 us a call).
_ENCODE_STR: Callable[[str], str] = json.encoder.encode_basestring
# Seeds are the client's to choose: the stamp cache starts over past this many pairs.
_STAMPS = 4096


@dataclass(frozen=True)
class Stamp:
    """The fingerprint fields one replica identity and one seed fix (`fields`), and the same
    as JSON without its closing brace (`json`), for `render` to continue; `system` is the
    identity's seed-free `system_fingerprint`; `headers` the response header lines they fix
    (`fingerprint.stamp_headers`), encoded."""

    fields: dict[str, Any]
    json: str
    system: str
    headers: tuple[tuple[bytes, bytes], ...] = ()


@dataclass
class Stamps:
    """(replica, seed) -> the stamp, rebuilt when the replica's identity object changes (a
    re-admission): the fingerprint id is a digest, and rendering the fields is half the cost
    of rendering an answer."""

    _cache: dict[tuple[str, int], tuple[ReplicaIdentity, Stamp]] = field(default_factory=dict)

    def get(self, replica: str, ident: ReplicaIdentity, seed: int) -> Stamp:
        cached = self._cache.get((replica, seed))
        if cached is not None and cached[0] is ident:
            return cached[1]
        if len(self._cache) >= _STAMPS:
            self._cache.clear()
        fields = {
            "fingerprint_id": ident.fingerprint_id(seed),
            "identity": "verified" if ident.verified else "unverified", "seed": seed,
            "model_hash": ident.model_hash, "env_digest": ident.env_digest,
            "engine": ident.engine, "engine_version": ident.engine_version,
            "device": ident.device, "tensor_parallel_size": ident.tensor_parallel_size,
            "replica": replica,
        }
        stamp = Stamp(fields, RESPONSE_JSON.encode(fields)[:-1], ident.system_fingerprint(),
                      tuple(encode_headers(stamp_headers(fields))))
        self._cache[(replica, seed)] = (ident, stamp)
        return stamp


def encode_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """Response headers as the lines an answer sends (names lower-case, both latin-1)."""
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def fingerprint_fields(stamp: Stamp, alone: bool, request_digest: str,
                       payload: dict[str, Any], decoded: bool = False) -> dict[str, Any]:
    """`Fingerprint`'s fields, in its order, for the request of `request_digest`
    (`fingerprint.parts_digest` of its canonical JSON) answered by `payload` (`decoded`: by
    msgspec's JSON decoder)."""
    fields = dict(stamp.fields)
    fields["serialized"] = alone
    fields["request_digest"] = request_digest
    fields["response_digest"] = response_digest(payload, decoded)
    return fields


# Not frozen: a frozen dataclass sets each field through object.__setattr__, ~0.5 us more per
# answer; nothing assigns to one after it is built.
@dataclass
class Forwarded:
    """The replica's answer and its fingerprint as `fields`, OpenAI's `system_fingerprint`
    (`Stamp.system`); `stamp_json` is the fields' fixed part as JSON (`Stamp.json`; empty:
    render them all), `stamp_headers` their header lines (`Stamp.headers`; empty: encode them
    all)."""

    payload: dict[str, Any]
    fields: dict[str, Any]
    system_fingerprint: str
    stamp_json: str = field(default="", repr=False)
    engine_json: bytes = field(default=b"", repr=False)
    stamp_headers: tuple[tuple[bytes, bytes], ...] = field(default=(), repr=False)

    @functools.cached_property
    def fingerprint(self) -> Fingerprint:
        # model_construct: every field was built by `fingerprint_fields` with its type.
        return Fingerprint.model_construct(**self.fields)


def wrap(forwarded: Forwarded) -> dict[str, Any]:
    """OpenAI's `system_fingerprint` names the serving configuration (no seed); `grm_fingerprint`
    carries everything, the seed and the fingerprint id included."""
    payload = dict(forwarded.payload)
    payload["system_fingerprint"] = forwarded.system_fingerprint
    payload["grm_fingerprint"] = dict(forwarded.fields)
    return payload


def render(forwarded: Forwarded) -> bytes:
    """`wrap(forwarded)` as starlette's JSONResponse renders it, with the fingerprint's fixed
    part spliced in as rendered once (`tests/unit/gateway/request/test_answer.py` holds it to the
    bytes)."""
    fields = forwarded.fields
    if not forwarded.stamp_json or "grm_fingerprint" in forwarded.payload:
        # An engine answer with a key of that name keeps it where it is: render the dict.
        return RESPONSE_JSON.encode(wrap(forwarded)).encode()
    # The digests are hex (`fingerprint.digest`): their JSON is the text in quotes.
    grm = (f',"grm_fingerprint":{forwarded.stamp_json}'
           f',"serialized":{"true" if fields["serialized"] else "false"}'
           f',"request_digest":"{fields["request_digest"]}"'
           f',"response_digest":"{fields["response_digest"]}"}}}}')
    if forwarded.engine_json:
        spliced = _spliced(forwarded.engine_json, forwarded.payload,
                           forwarded.system_fingerprint, grm)
        if spliced is not None:
            return spliced
    payload = dict(forwarded.payload)
    payload["system_fingerprint"] = forwarded.system_fingerprint
    head = RESPONSE_JSON.encode(payload)  # never "{}": it has system_fingerprint
    return f"{head[:-1]}{grm}".encode()


def _spliced(engine: bytes, payload: dict[str, Any], system: str, grm: str) -> bytes | None:
    """`engine` (strict JSON of `payload`) with `system_fingerprint` set and `grm` (the
    fingerprint member and the closing brace) appended; None where its end is not the payload's
    members from `system_fingerprint` on, as rendered here.

    Why that proves the result: the end is compared as bytes with members rendered from the
    payload, and it is preceded by "," or "{", so it starts outside any string (in valid JSON an
    unescaped quote there would close one) and holds whole top-level members; what comes before
    it is the engine's, unchanged."""
    if engine[-1:] != b"}" or not payload:
        return None
    ours = f'"system_fingerprint":{_ENCODE_STR(system)}'
    if "system_fingerprint" not in payload:  # appended after the engine's last member
        return engine[:-1] + f",{ours}{grm}".encode()
    keys = list(payload)
    after = keys[keys.index("system_fingerprint") + 1:]
    members = RESPONSE_JSON.encode({key: payload[key] for key in after})[1:-1]
    rest = f",{members}" if members else ""
    old = f'"system_fingerprint":{RESPONSE_JSON.encode(payload["system_fingerprint"])}{rest}}}'
    end = old.encode()
    start = len(engine) - len(end)
    if start < 1 or engine[start - 1] not in b",{" or not engine.endswith(end):
        return None
    return engine[:start] + f"{ours}{rest}{grm}".encode()
