"""`longstrings.loads` and `canonical.canonical_parts` give exactly what `json` gives: the same
Python values from `loads`, the same bytes from `canonical` (hence the same route digest and
request digest), for every body.

The reference for `canonical` is the definition of the canonical form, `json.dumps(body,
sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()`; for `loads`, the
hot path's parse before this module (`json` with NaN/Infinity literals refused). "The same"
means the same types too (1, 1.0 and True are equal in Python but not in JSON), the same dict
order, or the same exception type.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grm_service import fingerprint
from grm_service.canonical import KnownBytes, canonical_json, canonical_parts
from grm_service.errors import GrmError
from grm_service.gateway.request import longstrings, router
from grm_service.gateway.request.longstrings import LONG
from grm_service.gateway.request.shape import check_json_shape

# Fixed bytes: the test ids carry them, and xdist's workers must collect the same ids.
B64 = base64.b64encode(random.Random(3).randbytes(3 * LONG)).decode()
IMAGE = "data:image/png;base64," + B64


def canonical(body: Any, known: KnownBytes | None = None) -> bytes:
    return b"".join(canonical_parts(body, known))


def reference_canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _refuse(name: str) -> Any:
    raise ValueError(name)


def reference_loads(raw: bytes, parse_float: Callable[[str], Any] = float) -> Any:
    return json.JSONDecoder(parse_float=parse_float, parse_constant=_refuse).decode(raw.decode())


ERRORS = (json.JSONDecodeError, UnicodeError, ValueError, TypeError, RecursionError)


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """("value", the result) or ("error", the first of ERRORS the exception is an instance of)."""
    try:
        return "value", fn()
    except ERRORS as err:
        return "error", next(kind for kind in ERRORS if isinstance(err, kind))


def same(a: Any, b: Any) -> bool:
    """Equal with types, float bits and dict order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return math.copysign(1, a) == math.copysign(1, b) and (a == b or (a != a and b != b))
    return bool(a == b)


def same_outcome(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    return a[0] == b[0] and (same(a[1], b[1]) if a[0] == "value" else a[1] is b[1])


# ---- strategies -----------------------------------------------------------------------------

# Any code point, lone surrogates included (json parses "\ud800" to one).
ANY_CHAR = st.characters(exclude_categories=())
SPECIAL = st.sampled_from(['"', "\\", "/", "\x00", "\x1f", "\n", "\x7f", "é", "\u2028",
                           "\ud800", "\U0001f600", "NaN", "\\u0041", "\\/", " ", ":"])


@st.composite
def long_text(draw: st.DrawFn) -> str:
    """Around LONG characters (either side of it): base64, or a repeated unit, with a few
    characters that need escaping, or none, anywhere in it."""
    unit = draw(st.one_of(st.just(B64), st.text(ANY_CHAR, min_size=1, max_size=6),
                          st.sampled_from(["A", "ab/+", "é", "\x7f"])))
    size = LONG + draw(st.integers(-2, 40))
    text = (unit * (size // len(unit) + 1))[:size]
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(SPECIAL) + text[at:]
    return text


SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(), st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-05, 1e16, 1e+16, 1e22, -0.0, 0.1, 5e-324, 1.7976931348623157e308]),
    st.text(ANY_CHAR, max_size=12), long_text(), st.just(IMAGE),
)
KEYS = st.one_of(st.text(ANY_CHAR, max_size=8), st.sampled_from(["url", "NaN", "image_url"]),
                 long_text())
BODIES = st.recursive(
    SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                     st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=12)
SLOW = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.data_too_large])


# ---- canonical ------------------------------------------------------------------------------

@SLOW
@given(BODIES)
def test_canonical_is_json_dumps(body: Any) -> None:
    expected = outcome(lambda: reference_canonical(body))
    assert same_outcome(outcome(lambda: canonical(body)), expected)
    assert same_outcome(outcome(lambda: canonical_json(body)), expected)


EDGE_BODIES: list[Any] = [
    {"image": IMAGE, "seed": 2**70, "x": [1e-05, 1e16, 1e+16, -0.0, 1.0, 3, True, None]},
    {"a": "é" * LONG, "b": IMAGE},  # non-ASCII long string: the json path
    {"a": IMAGE + '"', "b": IMAGE + "\\", "c": IMAGE + "\x00", "d": IMAGE + "\x1f"},
    {"a": IMAGE + "\x7f", "b": IMAGE + "/", "c": "\u2028" + IMAGE},  # nothing to escape
    {"a": IMAGE + "\ud800"},  # a lone surrogate: UnicodeEncodeError either way
    {IMAGE: 1, "k": {IMAGE + "x": IMAGE}},  # long keys
    {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "img": IMAGE},
    [IMAGE, IMAGE, {"z": IMAGE, "a": "\x00"}],
    IMAGE,
    {"mixed": {1: IMAGE}},  # an int key: written as "1"
    {"mixed": {1: "x", "a": IMAGE}},  # unsortable keys: TypeError either way
    {"obj": object(), "img": IMAGE},  # not JSON: TypeError either way
]


@pytest.mark.parametrize("body", EDGE_BODIES)
def test_canonical_edge_cases(body: Any) -> None:
    expected = outcome(lambda: reference_canonical(body))
    assert same_outcome(outcome(lambda: canonical(body)), expected)
    assert same_outcome(outcome(lambda: canonical_json(body)), expected)


def test_canonical_copies_a_plain_long_string() -> None:
    body = {"b": IMAGE, "a": [IMAGE, 1.5]}
    assert canonical(body) == (
        b'{"a":["' + IMAGE.encode() + b'",1.5],"b":"' + IMAGE.encode() + b'"}')


def test_canonical_of_a_circular_body_fails_like_json() -> None:
    body: dict[str, Any] = {"img": IMAGE}
    body["self"] = body
    with pytest.raises(ValueError, match="Circular"):
        reference_canonical(body)
    with pytest.raises(ValueError, match="Circular"):
        canonical(body)


# ---- loads ----------------------------------------------------------------------------------

def _texts(body: Any) -> list[bytes]:
    """Ways a client may write the body: compact, spaced, indented, ASCII-escaped, with `\\/`."""
    out = []
    for options in ({"separators": (",", ":")}, {}, {"indent": 1}, {"ensure_ascii": True}):
        text = json.dumps(body, ensure_ascii=options.pop("ensure_ascii", False), **options)
        out.append(text.encode(errors="surrogatepass"))  # a lone surrogate: invalid UTF-8
    out.append(out[0].replace(b"/", b"\\/"))
    return out


@SLOW
@given(BODIES)
def test_loads_is_json_loads(body: Any) -> None:
    for raw in _texts(body):
        assert same_outcome(outcome(lambda r=raw: longstrings.loads(r)),
                            outcome(lambda r=raw: reference_loads(r)))


@SLOW
@given(BODIES)
def test_told_what_the_hot_paths_scans_found_loads_is_json_loads(body: Any) -> None:
    """The hot path looks for a backslash once, and the shape bound finds the long strings;
    told both, `loads` answers as json does, and lifts what it lifts when it looks itself."""
    for raw in _texts(body):
        try:
            strings = check_json_shape(raw, 10**6, 10**9)
        except GrmError:  # a lone surrogate: refused before any parse
            continue
        escaped = raw.find(b"\\") >= 0
        told, looked = longstrings.Lifted(), longstrings.Lifted()
        got = outcome(lambda r=raw, t=told, s=strings, e=escaped:
                      longstrings.loads(r, lifted=t, escaped=e, strings=s))
        alone = outcome(lambda r=raw, t=looked: longstrings.loads(r, lifted=t))
        assert same_outcome(got, outcome(lambda r=raw: reference_loads(r)))
        assert same_outcome(got, alone)
        if strings is not None and got[0] == "value":
            assert _lifted_count(got[1], told) >= _lifted_count(alone[1], looked)


def _lifted_count(value: Any, lifted: longstrings.Lifted) -> int:
    """How many of the strings in a parsed value `lifted` holds."""
    if isinstance(value, dict):
        return sum(_lifted_count(v, lifted) for v in value.values())
    if isinstance(value, list):
        return sum(_lifted_count(v, lifted) for v in value)
    return int(isinstance(value, str) and lifted.bytes_of(value) is not None)


def test_the_shape_bound_finds_the_long_strings_the_parse_lifts() -> None:
    raw = b'{"a": "x", "b": ["' + IMAGE.encode() + b'", "' + b"t" * LONG + b'"], "c": "y"}'
    first = raw.find(IMAGE.encode())
    second = raw.find(b"t" * LONG)
    strings = check_json_shape(raw, 64, 1000)
    assert strings == [(first, first + len(IMAGE)), (second, second + LONG)]
    lifted = longstrings.Lifted()
    body = longstrings.loads(raw, lifted=lifted, escaped=False, strings=strings)
    assert body == json.loads(raw)
    assert lifted.bytes_of(body["b"][0]) == IMAGE.encode()
    assert lifted.bytes_of(body["b"][1]) == b"t" * LONG
    many = b"[" + b'"s",' * 300 + b'"' + IMAGE.encode() + b'"]'
    assert check_json_shape(many, 64, 1000) is None  # past the strings found one by one


def _parsed_then_canonical(raw: bytes, change: Callable[[Any], Any]) -> bytes:
    lifted = longstrings.Lifted()
    return canonical(change(longstrings.loads(raw, lifted=lifted)), lifted)


@SLOW
@given(BODIES)
def test_canonical_of_a_parsed_body_is_json_dumps(body: Any) -> None:
    """What the hot path does: parse, prepare (the strings `loads` lifted are reused as they
    were sent), canonical JSON."""
    def prepare(value: Any) -> Any:
        return {"seed": 1, "body": value, "copy": value} if isinstance(value, dict) else value

    for raw in _texts(body):
        expected = outcome(lambda r=raw: reference_canonical(prepare(reference_loads(r))))
        got = outcome(lambda r=raw: _parsed_then_canonical(r, prepare))
        assert same_outcome(got, expected)


def test_lifted_strings_are_spliced_as_sent() -> None:
    raw = b'{"b":"' + IMAGE.encode() + b'","a":"' + "é".encode() * LONG + b'"}'
    lifted = longstrings.Lifted()
    body = longstrings.loads(raw, lifted=lifted)
    assert lifted.bytes_of(body["b"]) == IMAGE.encode()
    assert lifted.bytes_of(body["a"]) == "é".encode() * LONG  # non-ASCII: still its JSON form
    assert lifted.bytes_of(IMAGE) is None  # an equal string is not the lifted one
    body["c"] = body["b"][:-1] + "\x00"  # a new long string: checked, escaped
    assert canonical(body, lifted) == reference_canonical(body)


def _mutate(raw: bytes, at: int, action: str, byte: bytes) -> bytes:
    at %= len(raw) + 1
    if action == "insert":
        return raw[:at] + byte + raw[at:]
    if action == "replace":
        return raw[:at] + byte + raw[at + 1:]
    return raw[:at] + raw[at + 1:]


@SLOW
@given(BODIES, st.lists(st.tuples(st.integers(0, 1 << 20), st.sampled_from(
    ["insert", "replace", "delete"]), st.sampled_from(
    [b'"', b"\\", b"\x00", b"\n", b" ", b":", b",", b"]", b"}", b"{", b"[", b"NaN", b"\xff",
     b"\xc3", b"1", b"-", b"e", b"a"])), min_size=1, max_size=3))
def test_loads_of_broken_bodies_is_json_loads(body: Any, edits: list[Any]) -> None:
    raw = _texts(body)[0]
    for at, action, byte in edits:
        raw = _mutate(raw, at, action, byte)
    assert same_outcome(outcome(lambda: longstrings.loads(raw)),
                        outcome(lambda: reference_loads(raw)))


PAD = b"1," * LONG
EDGE_TEXTS = [
    b'{"a":"' + IMAGE.encode() + b'","b":NaN}',  # a client's NaN: refused
    b'{"a":"' + IMAGE.encode() + b'","b":Infinity}',
    b'{"a":"' + IMAGE.encode() + b'","b":-Infinity}',
    b'{"a":"' + IMAGE.encode() + b'","b":"NaN"}',  # NaN text in a string: fine
    b'{"a":"' + IMAGE.encode() + b'","b":1e999}',
    b'{"a":"' + IMAGE.encode() + b'","a":2}',  # duplicate key: the last value wins
    b'{"a":2,"a":"' + IMAGE.encode() + b'"}',
    b'{"' + IMAGE.encode() + b'":1}',  # a long key
    b'{"' + IMAGE.encode() + b'"  \n :1}',
    b'["' + IMAGE.encode() + b'"' + b" " * 100 + b"]",  # whitespace past the look-ahead
    b'["a",' + PAD + b'"b"]',  # a long quote-free run that is not a string
    b'["a",' + PAD + b'"]"]',  # ... followed by what looks like a value's end
    b'["a",' + PAD + b'"]",NaN]',  # ... with a client's NaN where a lifted string could go
    b'["a\\",' + PAD + b'"]',  # an escaped quote before the run
    b'["\\\\",' + PAD + b'1]',
    b'["' + IMAGE.encode() + b'\x01"]',  # a raw control character: invalid JSON
    b'["' + IMAGE.encode() + b'\x7f"]',
    b'["' + IMAGE.encode() + b'\xff"]',  # invalid UTF-8
    b'["' + "é".encode() * LONG + b'"]',
    b'["' + IMAGE.encode() + b'\\/"]',
    b'["' + IMAGE.encode() + b'"',  # truncated
    b'["' + IMAGE.encode(),
    b'"' + IMAGE.encode() + b'"',
    b'NaN"' + IMAGE.encode() + b'"',
    b'["' + IMAGE.encode() + b'",Na',
    b'[Na"' + IMAGE.encode() + b'"]',
    b'{"seed":' + b"9" * 5000 + b',"a":"' + IMAGE.encode() + b'"}',  # past int's digit limit
    b'{"x":' + str(2**100).encode() + b',"y":1E+16,"z":-0.0,"a":"' + IMAGE.encode() + b'"}',
]


@pytest.mark.parametrize("raw", EDGE_TEXTS)
def test_loads_edge_cases(raw: bytes) -> None:
    assert same_outcome(outcome(lambda: longstrings.loads(raw)),
                        outcome(lambda: reference_loads(raw)))


class _Infinite(Exception):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Infinite
    return value


@pytest.mark.parametrize("raw", EDGE_TEXTS)
def test_loads_calls_parse_float_like_json(raw: bytes) -> None:
    def run(fn: Callable[[bytes, Callable[[str], Any]], Any]) -> Any:
        try:
            return fn(raw, _finite)
        except _Infinite:
            return _Infinite
        except ValueError:
            return ValueError

    got, expected = run(longstrings.loads), run(reference_loads)
    assert got is expected if expected in (_Infinite, ValueError) else same(got, expected)


def test_loads_lifts_the_image_out_of_the_parse() -> None:
    """The fast path is taken (not only the fallback): the image string comes back whole."""
    raw = json.dumps({"messages": [{"content": [{"image_url": {"url": IMAGE}}]}]}).encode()
    value = longstrings.loads(raw)
    assert value["messages"][0]["content"][0]["image_url"]["url"] == IMAGE
    assert longstrings._gaps(raw) == [(raw.index(IMAGE.encode()), raw.index(IMAGE.encode())
                                       + len(IMAGE))]


@example(b'["' + B64.encode() + b'"]')
@example(b'"' + b"x" * (LONG - 1) + b'"' + b"y" * LONG + b'"' + b"z" * (LONG + 1) + b'"')
@given(st.binary(max_size=200).map(lambda b: b + b"x" * LONG + b))
def test_gaps_finds_every_long_quote_free_run(raw: bytes) -> None:
    quotes = [i for i, c in enumerate(raw) if c == 0x22]
    expected = [(a + 1, b) for a, b in itertools.pairwise(quotes) if b - a - 1 >= LONG]
    assert longstrings._gaps(raw) == expected


@given(st.binary(max_size=3 * LONG), st.lists(st.integers(0, 3 * LONG), max_size=4))
def test_key_and_digest_of_parts_are_those_of_the_bytes(data: bytes, cuts: list[int]) -> None:
    bounds = [0, *sorted(min(c, len(data)) for c in cuts), len(data)]
    view = memoryview(data)
    spans = enumerate(itertools.pairwise(bounds))
    parts = [view[a:b] if i % 2 else data[a:b] for i, (a, b) in spans]
    assert router.route_digest_of_parts(parts) == router.route_digest(data)
    assert fingerprint.parts_digest(parts) == fingerprint.digest(data)


def test_canonical_parts_join_to_the_canonical_bytes() -> None:
    raw = b'{"b":"' + IMAGE.encode() + b'","a":[1,"' + IMAGE.encode() + b'"]}'
    lifted = longstrings.Lifted()
    body = longstrings.loads(raw, lifted=lifted)
    parts = canonical_parts(body, lifted)
    assert any(isinstance(p, memoryview) for p in parts)  # the image is not copied
    assert b"".join(parts) == reference_canonical(body)
