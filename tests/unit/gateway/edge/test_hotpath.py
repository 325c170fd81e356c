"""The hot path's own parsing and validation give the bytes FastAPI + pydantic gave, or step aside.

The request digest, the route digest and the forwarded body are all the canonical JSON of the
validated body, so "the same" here means the same canonical bytes, not Python equality (1 == 1.0
in Python, but `"temperature":1` and `"temperature":1.0` are different requests).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from grm_service.canonical import canonical_json, canonical_parts
from grm_service.gateway.edge.hotpath import load_json, parse
from grm_service.gateway.edge.rules import CHAT_RULES, NotPlain
from grm_service.gateway.edge.schemas import ChatCompletionRequest
from grm_service.gateway.request import longstrings

MSG = [{"role": "user", "content": "héllo \u2028 \"quoted\" \\ \x01"}]

BODIES: list[Any] = [
    {"messages": MSG},
    {"messages": MSG, "seed": 0, "max_tokens": 1, "temperature": 0, "top_p": 1, "top_k": -1},
    {"messages": MSG, "seed": 2**63 - 1, "temperature": 0.7, "top_p": 0.8, "top_k": 20},
    {"messages": MSG, "temperature": 1, "top_p": 1e-05, "logprobs": True, "extra": [1, 1.0]},
    {"messages": MSG, "model": "rm", "stream": False, "max_completion_tokens": 3},
    {"messages": MSG, "model": None, "seed": None, "temperature": None, "stream": None},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}], "n": 1},
    {"messages": MSG, "response_format": {"type": "json_object"}, "stop": ["\n"]},
    {"messages": MSG, "temperature": 2**53},
    {"messages": MSG, "temperature": 2**60},  # past 2**53: left to pydantic
    {"messages": MSG, "seed": 5.0},  # Any: kept as sent (the checkpoint refuses it)
    {"messages": MSG, "seed": True},
    {"messages": MSG, "seed": "5"},
    {"messages": MSG, "seed": -1},
    {"messages": MSG, "seed": 2**63},
    {"messages": MSG, "max_tokens": 0},
    {"messages": MSG, "top_p": 0},
    {"messages": MSG, "top_p": 1.5},
    {"messages": MSG, "top_k": -2},
    {"messages": MSG, "temperature": -0.1},
    {"messages": MSG, "temperature": True},
    {"messages": MSG, "temperature": "0.5"},
    {"messages": MSG, "stream": 1},
    {"messages": MSG, "stream": True},
    {"messages": MSG, "model": 3},
    {"messages": []},
    {"messages": ["not a dict"]},
    {"messages": {"role": "user"}},
    {"seed": 1},
    [{"messages": MSG}],
    "messages",
]


def _pydantic(body: Any) -> bytes | None:
    try:
        dumped = ChatCompletionRequest.model_validate(body).model_dump(exclude_unset=True,
                                                                        mode="json")
    except ValueError:  # pydantic's ValidationError
        return None
    return canonical_json(dumped)


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_fast_path_matches_pydantic_or_steps_aside(body: Any) -> None:
    raw = json.dumps(body).encode()
    expected = _pydantic(json.loads(raw))
    try:
        got = canonical_json(CHAT_RULES.fast(load_json(raw)))
    except NotPlain:
        return  # FastAPI serves it, exactly as before
    assert expected is not None, "the fast path accepted what pydantic refuses"
    assert got == expected


def test_plain_bodies_take_the_fast_path() -> None:
    """A fast path that always stepped aside would pass the test above."""
    plain = [b for b in BODIES[:9] if isinstance(b, dict)]
    for body in plain:
        assert canonical_json(CHAT_RULES.fast(load_json(json.dumps(body).encode()))) == \
            _pydantic(body)


@pytest.mark.parametrize("raw", [
    b'{"messages": [{"a": NaN}]}', b'{"messages": [{"a": Infinity}]}',
    b'{"messages": [{"a": -Infinity}]}', b'{"messages": [{"a": 1e999}]}',
    b'{"messages": [{"a": "\xff"}]}', b'\xef\xbb\xbf{"messages": [{}]}', b'{"messages": [{}]',
])
def test_non_finite_or_undecodable_bodies_go_to_fastapi(raw: bytes) -> None:
    with pytest.raises(NotPlain):
        CHAT_RULES.fast(load_json(raw))


@pytest.mark.parametrize("raw", [
    json.dumps(b).encode() for b in BODIES if isinstance(b, dict)] + [
    b'{"a":1,"b":2,"a":[3, -0.0, 1E+2, 2.5e-324, 1.7976931348623157e308]}',
    b'{"n": 123456789012345678901234567890, "s": "\\u00e9\\n\\"", "e": {}, "l": []}',
    '{"t": "h\u00e9llo \u2028 \U0001f600"}'.encode(),
    b'{"lone": "\\ud800"}', b'{"pair": "\\ud83d\\ude00"}',
])
def test_short_bodies_parse_to_the_stdlib_parsers_values(raw: bytes) -> None:
    """Whichever parser takes a short body, its values are the stdlib's: types, key order (the
    last of repeated keys), float bits and the lone surrogate escape json.loads keeps."""
    assert repr(load_json(raw)) == repr(json.loads(raw))


IMAGE = "data:image/png;base64," + "iVBORw0KGgo/+" * (2 * longstrings.LONG // 13)
IMAGE_BODIES: list[Any] = [
    {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": IMAGE}}, {"type": "text", "text": "é\n\\"}]}],
     "temperature": 0.0, "seed": 3},
    {"messages": [{"role": "user", "content": IMAGE}], "top_p": 1e-05, "extra": [2**70, 1e16]},
    {"messages": [{"role": "user", "content": "x" * longstrings.LONG + "\x01"}]},
    {"messages": [{"role": "user", "content": IMAGE}], "seed": True},
]


@pytest.mark.parametrize("body", IMAGE_BODIES, ids=range(len(IMAGE_BODIES)))
def test_bodies_with_long_strings_give_pydantic_bytes(body: Any) -> None:
    """Parsed without their long strings, canonical JSON with them spliced back in."""
    for raw in (json.dumps(body).encode(), json.dumps(body, indent=1).encode()):
        lifted = longstrings.Lifted()
        try:
            parsed = CHAT_RULES.fast(load_json(raw, lifted))
        except NotPlain:
            assert _pydantic(json.loads(raw)) is None or body.get("seed") is True
            continue
        assert b"".join(canonical_parts(parsed, lifted)) == _pydantic(json.loads(raw))
        images = [s for s in _strings(parsed) if s == IMAGE]
        assert all(lifted.bytes_of(s) is not None for s in images), "parsed the slow way"
        # As `HotPath.serve` parses: told what the shape bound's scans found.
        served, told = parse(raw, 64, 100_000)
        assert told is not None
        assert b"".join(canonical_parts(CHAT_RULES.fast(served), told)) == \
            _pydantic(json.loads(raw))
        assert all(told.bytes_of(s) is not None for s in _strings(served) if s == IMAGE)


def _strings(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value]


@pytest.mark.parametrize("tail", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b'"\xff"'])
def test_long_bodies_with_non_finite_or_undecodable_values_go_to_fastapi(tail: bytes) -> None:
    raw = b'{"messages": [{"content": "' + IMAGE.encode() + b'"}], "a": ' + tail + b"}"
    with pytest.raises(NotPlain):
        CHAT_RULES.fast(load_json(raw, longstrings.Lifted()))


@pytest.mark.parametrize("body", IMAGE_BODIES[:2], ids=range(2))
def test_long_strings_with_escaped_slashes_are_parsed_the_slow_way_to_the_same_bytes(
    body: Any,
) -> None:
    """`\\/` in an image (some clients' JSON writers escape every slash): the shape bound finds
    the string, the backslash keeps it from being lifted, and the bytes are pydantic's."""
    raw = json.dumps(body).encode().replace(b"/", b"\\/")
    served, lifted = parse(raw, 64, 100_000)
    assert lifted is not None
    assert b"".join(canonical_parts(CHAT_RULES.fast(served), lifted)) == \
        _pydantic(json.loads(raw))
    assert all(lifted.bytes_of(s) is None for s in _strings(served) if s == IMAGE)
