"""The answer as the API sends it: the fingerprint fields kept as a dict, rendered with a
pre-rendered fixed part, must give exactly the bytes of the pydantic `Fingerprint` route
(`Fingerprint(...).model_dump()` in the payload, starlette's JSONResponse)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.responses import JSONResponse

from grm_service.engine_side.identity import ReplicaIdentity
from grm_service.fingerprint import Fingerprint, digest, fingerprint_headers, response_digest
from grm_service.gateway.edge.replies import answer_reply
from grm_service.gateway.request.answer import (
    Forwarded,
    Stamps,
    encode_headers,
    fingerprint_fields,
    render,
    wrap,
)

RAW = b'{"messages":[{"content":"hi","role":"user"}],"model":"rm","seed":7}'


def identity(**changes: Any) -> ReplicaIdentity:
    values: dict[str, Any] = {
        "verified": True, "served_model": "rm", "engine": "vllm", "engine_version": "0.25.0",
        "model_hash": "blake3:" + "ab" * 16, "env_digest": "cd" * 8,
        "device": "NVIDIA H200 / driver 570 — ünïcode", "tensor_parallel_size": 1,
        "env_inputs": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
    }
    return ReplicaIdentity(**{**values, **changes})


PAYLOADS: list[dict[str, Any]] = [
    {"id": "c1", "choices": [{"index": 0, "message": {"role": "assistant", "content": "yes"},
                              "logprobs": None}], "usage": {"total_tokens": 3}},
    # vLLM sends system_fingerprint: null; the id replaces it where it stands.
    {"id": "c2", "system_fingerprint": None, "created": 1.5,
     "choices": [{"index": 0, "message": {"content": "naïve — 日本 \"q\" \\\\ \n"}}]},
    # An engine key named like ours keeps its place: the dict is rendered as a whole.
    {"grm_fingerprint": "engine's", "choices": []},
    {"object": "list", "data": [{"index": 0, "probs": [0.25, 0.75]}]},
]


def pydantic_route(payload: dict[str, Any], fp: Fingerprint, system: str) -> bytes:
    """The answer as the FastAPI route rendered it with the model."""
    wrapped = dict(payload)
    wrapped["system_fingerprint"] = system
    wrapped["grm_fingerprint"] = fp.model_dump()
    return bytes(JSONResponse(wrapped).body)


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("alone", [False, True])
@pytest.mark.parametrize("ident", [identity(), identity(verified=False, model_hash=None,
                                                         env_digest=None, device=None),
                                   identity(tensor_parallel_size=2)])
def test_rendered_answer_is_the_pydantic_routes_bytes(payload: dict[str, Any], alone: bool,
                                                      ident: ReplicaIdentity) -> None:
    stamp = Stamps().get("replica-0", ident, 7)
    fields = fingerprint_fields(stamp, alone, digest(RAW), payload)
    answer = Forwarded(payload, fields, ident.system_fingerprint(), stamp.json)
    model = Fingerprint(
        fingerprint_id=ident.fingerprint_id(7), identity="verified" if ident.verified
        else "unverified", seed=7, model_hash=ident.model_hash, env_digest=ident.env_digest,
        engine=ident.engine, engine_version=ident.engine_version, device=ident.device,
        tensor_parallel_size=ident.tensor_parallel_size, replica="replica-0", serialized=alone,
        request_digest=digest(RAW),
        response_digest=response_digest(payload))
    # `cache` is there only on answers served from the ledger (grm_service/ledger/cache.py).
    assert list(fields) == [name for name in Fingerprint.model_fields if name != "cache"]
    assert fields == model.model_dump()
    assert render(answer) == pydantic_route(payload, model, ident.system_fingerprint())
    # no stamp: the whole dict
    assert render(Forwarded(payload, fields, stamp.system)) == render(answer)
    # the engine's bytes as vLLM writes them (starlette's compact JSON): kept, the same bytes
    engine = bytes(JSONResponse(payload).body)
    kept = Forwarded(payload, fields, ident.system_fingerprint(), stamp.json, engine)
    assert render(kept) == render(answer)
    assert bytes(JSONResponse(wrap(answer)).body) == render(answer)
    assert answer.fingerprint == model
    assert fingerprint_headers(fields) == model.headers()
    # the header lines: the stamp's encoded once, then the answer's, as when all are encoded
    stamped = Forwarded(payload, fields, stamp.system, stamp.json, stamp_headers=stamp.headers)
    assert answer_reply(stamped) == answer_reply(answer)
    assert answer_reply(stamped)[1][:5] == encode_headers(model.headers())
    marked = {**fields, "cache": "hit"}
    assert (answer_reply(Forwarded(payload, marked, stamp.system, stamp_headers=stamp.headers))
            == answer_reply(Forwarded(payload, marked, stamp.system)))


def test_stamps_follow_the_replicas_identity_object() -> None:
    stamps, first, second = Stamps(), identity(), identity(engine_version="0.26.0")
    stamp = stamps.get("r0", first, 1)
    assert stamps.get("r0", first, 1) is stamp
    assert stamps.get("r0", first, 2) is not stamp
    renewed = stamps.get("r0", second, 1)  # re-admitted with another identity
    assert renewed.fields["engine_version"] == "0.26.0"
    assert renewed.fields["fingerprint_id"] == second.fingerprint_id(1)


def test_every_answer_names_the_tensor_parallel_size_of_its_replica() -> None:
    payload = PAYLOADS[0]
    stamp = Stamps().get("r0", identity(tensor_parallel_size=2), 7)
    fields = fingerprint_fields(stamp, False, digest(RAW), payload)
    answer = Forwarded(payload, fields, stamp.system, stamp.json)
    assert json.loads(render(answer))["grm_fingerprint"]["tensor_parallel_size"] == 2


def test_system_fingerprint_is_the_serving_configuration_without_the_seed() -> None:
    """OpenAI defines `system_fingerprint` as the serving configuration: one value whatever
    seed a request chose (the seed and the seeded id stay in `grm_fingerprint`), another for
    any other model, engine build or numerics."""
    ident, stamps = identity(), Stamps()
    answers = {}
    for seed in (1, 2):
        stamp = stamps.get("r0", ident, seed)
        fields = fingerprint_fields(stamp, False, digest(RAW), PAYLOADS[0])
        answers[seed] = json.loads(render(Forwarded(PAYLOADS[0], fields, stamp.system,
                                                    stamp.json)))
    one, two = answers[1], answers[2]
    assert one["system_fingerprint"] == two["system_fingerprint"] == (
        "grm-sys-" + digest(b"blake3:" + b"ab" * 16 + b"|" + b"cd" * 8, 16))
    assert (one["grm_fingerprint"]["seed"], two["grm_fingerprint"]["seed"]) == (1, 2)
    assert one["grm_fingerprint"]["fingerprint_id"] == ident.fingerprint_id(1)
    assert two["grm_fingerprint"]["fingerprint_id"] == ident.fingerprint_id(2)
    assert ident.fingerprint_id(1) != ident.fingerprint_id(2)
    assert stamps.get("r1", ident, 3).system == ident.system_fingerprint()  # another replica
    others = [identity(model_hash="blake3:" + "ef" * 16), identity(env_digest="00" * 8),
              identity(verified=False, model_hash=None, env_digest=None)]
    systems = {ident.system_fingerprint(), *(o.system_fingerprint() for o in others)}
    assert len(systems) == 4
    unverified = others[-1]
    assert unverified.system_fingerprint().startswith("grm-unverified-")
    assert unverified.system_fingerprint() == identity(
        verified=False, model_hash=None, env_digest=None).system_fingerprint()


_LEAVES = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
_VALUES = st.recursive(_LEAVES, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=12)
_KEYS = st.sampled_from(["id", "object", "system_fingerprint", "usage", "model", "x\"y", "é"])


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_KEYS, _VALUES, min_size=1, max_size=6),
       st.sampled_from([(",", ":"), (", ", ": "), (",", " : ")]), st.booleans(),
       st.sampled_from([None, 2]))
def test_kept_engine_bytes_parse_to_the_wrapped_answer(
        payload: dict[str, Any], separators: tuple[str, str], ascii_only: bool,
        indent: int | None) -> None:
    """Whatever way the engine formats its JSON, the answer kept from its bytes is the wrapped
    answer's value; written as starlette writes it, it is the re-rendered answer's bytes."""
    ident = identity()
    stamp = Stamps().get("r0", ident, 7)
    fields = fingerprint_fields(stamp, False, digest(RAW), payload)
    engine = json.dumps(payload, separators=separators, ensure_ascii=ascii_only,
                        indent=indent).encode()
    kept = Forwarded(payload, fields, ident.system_fingerprint(), stamp.json, engine)
    whole = Forwarded(payload, fields, ident.system_fingerprint(), stamp.json)
    assert json.loads(render(kept)) == wrap(whole)
    if separators == (",", ":") and not ascii_only and indent is None:
        assert render(kept) == render(whole)


def test_engine_bytes_whose_end_is_not_the_payloads_are_rendered_again() -> None:
    """A trailing member the payload does not hold (or holds otherwise): the dict is rendered."""
    ident = identity()
    stamp = Stamps().get("r0", ident, 7)
    payload = {"id": "c", "system_fingerprint": None, "usage": {"total_tokens": 3}}
    fields = fingerprint_fields(stamp, False, digest(RAW), payload)
    whole = render(Forwarded(payload, fields, ident.system_fingerprint(), stamp.json))
    for engine in (b'{"id":"c","system_fingerprint":null,"usage":{"total_tokens":4}}',
                   b'{"id":"c","system_fingerprint":null,"usage":{"total_tokens":3}} ',
                   b'{"id":"c","system_fingerprint":null}'):
        kept = Forwarded(payload, fields, ident.system_fingerprint(), stamp.json, engine)
        assert render(kept) == whole
