"""`jsonload.loads_strict` gives `json.loads`' value: the same values (compared by repr: types,
key order, float bits) and the same errors, on generated documents and on what msgspec
refuses."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grm_service import jsonload

_LEAVES = (st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
_DOCS = st.recursive(_LEAVES, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=30)


def _loads(raw: bytes) -> Any:
    return jsonload.loads_strict(raw)[0]


def _outcome(parse: Any, raw: bytes) -> tuple[str, str]:
    try:
        return "ok", repr(parse(raw))
    except (ValueError, RecursionError) as err:
        return "error", type(err).__name__


@settings(max_examples=300, deadline=None)
@given(_DOCS, st.booleans())
def test_generated_documents_parse_as_json_loads_parses_them(doc: Any, ascii_only: bool) -> None:
    raw = json.dumps(doc, ensure_ascii=ascii_only).encode()
    assert repr(_loads(raw)) == repr(json.loads(raw))
    assert jsonload.loads_strict(raw)[1]  # json.dumps writes strict JSON: msgspec took it


@pytest.mark.parametrize("raw", [
    b"NaN", b"[Infinity, -Infinity]", b"1e999", b'"\\ud800"', b'"\xed\xa0\x80"',
    b"\xef\xbb\xbf{}", '{"a": 1}'.encode("utf-16"), b"[" * 5000 + b"]" * 5000,
    b'{"a":1,"a":2}', b"12345678901234567890123456789", b"-0.0", b"1E+2",
    b'{"a":1}x', b'"\xff"', b'"a\x01b"', b"01", b"[1,]", b"", b"  [1]  ",
])
def test_what_msgspec_refuses_or_reads_its_own_way_is_json_loads_result(raw: bytes) -> None:
    assert _outcome(_loads, raw) == _outcome(json.loads, raw)


def test_a_non_finite_literal_still_parses_to_the_float() -> None:
    payload, strict = jsonload.loads_strict(b'{"logprob": -Infinity}')
    assert math.isinf(payload["logprob"]) and payload["logprob"] < 0
    assert not strict  # not JSON: its bytes are never sent on as they are


def test_msgspec_takes_the_plain_documents() -> None:
    """The speed comes from msgspec: it parses a typical engine answer itself."""
    raw = b'{"choices":[{"index":0,"logprobs":{"content":[{"token":"a","logprob":-1.5e-05}]}}]}'
    assert jsonload.loads_strict(raw) == (msgspec.json.decode(raw), True)
