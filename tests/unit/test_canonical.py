"""`canonical.canonical_value` gives exactly `canonical_json`'s bytes, which are
`json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()`: on
generated JSON values (their strings made of quotes, backslashes and the numbers it rewrites
too), on strings made to look like those numbers, and on floats of every range (random bit
patterns, each power of ten and of two and their neighbours, float32 values as logprobs are).
Both ways are held to the reference: the msgspec form where it answers, and the C encoder
where it declines; and the msgspec form's two proofs, the read-back and, for values msgspec's
decoder built (`decoded`), the parity of the quotes that delimit strings.
"""

from __future__ import annotations

import json
import math
import random
import struct
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grm_service import canonical
from grm_service.canonical import _msgspec_form, canonical_body, canonical_json, canonical_value


def reference(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def decoded_gives_reference(value: Any) -> None:
    """The value as msgspec's decoder builds it from JSON (where it takes the JSON), given as
    `decoded`: the reference's bytes by both ways."""
    want = reference(value)
    try:
        parsed = msgspec.json.decode(want)
    except msgspec.DecodeError:  # infinities: msgspec refuses them, no decoded value exists
        return
    assert canonical_value(parsed, decoded=True) == want
    fast = _msgspec_form(parsed, decoded=True)
    assert fast is None or fast == want


def floats_of_every_range() -> list[float]:
    rng = random.Random(23)
    out = [struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
           for _ in range(100_000)]
    out += [struct.unpack("<f", rng.getrandbits(32).to_bytes(4, "little"))[0]
            for _ in range(100_000)]
    out += [-rng.expovariate(1.0) * 10.0 ** rng.randint(-12, 3) for _ in range(100_000)]
    for exponent in range(-325, 309):
        for mantissa in (1.0, 1.5, 2.5, 9.999999999999999, 1.0000000000000002):
            with_inf = mantissa * 10.0 ** exponent if exponent < 308 else mantissa * 1e308
            out += [with_inf, math.nextafter(with_inf, 0.0), math.nextafter(with_inf, math.inf)]
    for exponent in range(-1074, 1024):
        out += [math.ldexp(1.0, exponent), -math.ldexp(1.0, exponent)]
    return [x for x in out if math.isfinite(x)]


def test_floats_of_every_range_are_laid_out_as_python_does() -> None:
    floats = floats_of_every_range()
    for start in range(0, len(floats), 20_000):
        chunk = floats[start:start + 20_000]
        fast = _msgspec_form(chunk)
        assert fast is not None  # finite floats: always the msgspec form
        assert fast == reference(chunk)


def logprobs_answer(rng: random.Random, tokens: int) -> list[dict[str, Any]]:
    """What `fingerprint.produced` takes from an answer with logprobs: most confident."""
    content = []
    for _ in range(tokens):
        token = rng.choice(["Invoice", " total", " 12", ".", "50", "\n", '"', "é", "e-7"])
        logprob = -rng.expovariate(1.0) * (1e-5 if rng.random() < 0.7 else 1.0)
        top = [{"token": token, "logprob": logprob, "bytes": list(token.encode())}]
        content.append({"token": token, "logprob": logprob, "bytes": list(token.encode()),
                        "top_logprobs": top})
    text = "".join(entry["token"] for entry in content)
    return [{"index": 0, "content": text, "logprobs": {"content": content}}]


def test_an_answer_with_logprobs_takes_the_msgspec_form() -> None:
    rng = random.Random(5)
    for _ in range(50):
        value = logprobs_answer(rng, 128)
        for entry in value[0]["logprobs"]["content"]:  # text that would be rewritten: not here
            entry["token"] = entry["token"].replace("e-7", "x")
        value[0]["content"] = "".join(e["token"] for e in value[0]["logprobs"]["content"])
        assert _msgspec_form(value) == reference(value)
        assert canonical_value(value) == reference(value)
        assert _msgspec_form(value, decoded=True) == reference(value)


def test_a_decoded_answer_with_text_like_numbers_gives_the_reference_bytes() -> None:
    rng = random.Random(6)
    for _ in range(50):  # tokens with quotes, "e-7" and newlines: the parity or the read-back
        decoded_gives_reference(logprobs_answer(rng, 128))


@pytest.mark.parametrize("text", [
    "1e-7", "2e16", "x:1e-7,", "[0.00001]", "0.000012", "10.00005", "Invoice50", "e-6", "\u001e7",
    "a 1e+16 b", "null", "-0.0000123", "1.5e-10", 'q"1e-7', '\\"1e-7', '\\', '\\1e-7"0.00001',
    '"', '\\"', ":0.00002,",
])
def test_a_string_that_looks_like_a_rewritten_number_is_kept(text: str) -> None:
    for value in (text, [text, 1e-7, 1.2e-5], {text: 1e16, "k": [text]}, {"token": text}):
        assert canonical_value(value) == reference(value)
        fast = _msgspec_form(value)
        assert fast is None or fast == reference(value)
        decoded_gives_reference(value)


@pytest.mark.parametrize("value", [
    [math.nan], {"x": math.inf}, [-math.inf, None], b"bytes", {1: "int key"}, (1.5e-5, "tuple"),
    {"s": {1, 2}}, 2**80, [True, 1, 1.0, None, -0.0, 0.0], "\U0001f600é\x7f\u2028",
])
def test_what_is_not_plain_json_gives_json_dumps_bytes_or_its_error(value: Any) -> None:
    try:
        want: bytes | type[Exception] = reference(value)
    except (TypeError, ValueError) as error:
        want = type(error)
    if isinstance(want, bytes):
        assert canonical_value(value) == want == canonical_json(value)
    else:
        with pytest.raises(want):
            canonical_value(value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, [1.5, math.nan, "null"]])
def test_a_request_body_with_a_non_finite_float_gives_json_dumps_bytes(value: Any) -> None:
    """msgspec writes these `null`, which the quotes' proof cannot tell from JSON's null."""
    body = {"temperature": value, "messages": [{"role": "user", "content": "1e-7 null"}]}
    assert canonical_body(body) == reference(body)


def test_a_lone_surrogate_raises_as_the_c_encoder_does() -> None:
    with pytest.raises(UnicodeEncodeError):
        canonical_json("\ud800")
    with pytest.raises(UnicodeEncodeError):
        canonical_value("\ud800")


# Text made of what the rewrites look for, and of quotes and backslashes around it.
TRICKY = st.text(alphabet='"\\e-+0.123456789x:,[]{}\n', max_size=24)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.floats(min_value=-1e-4, max_value=1e-4) | TRICKY
    | st.text(alphabet=st.characters(blacklist_categories=("Cs",))),
    lambda children: st.lists(children, max_size=6)
    | st.dictionaries(TRICKY | st.text(alphabet=st.characters(blacklist_categories=("Cs",)),
                                         max_size=8), children, max_size=6),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(JSON)
def test_generated_json_values_give_the_reference_bytes(value: Any) -> None:
    assert canonical_value(value) == reference(value)
    assert canonical_body({"body": value, "seed": 7}) == reference({"body": value, "seed": 7})
    fast = _msgspec_form(value)
    assert fast is None or fast == reference(value)
    decoded_gives_reference(value)


def test_a_decoded_value_is_proven_by_the_quotes_without_a_read_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    value = msgspec.json.decode(reference(
        [{"content": "total 12.50", "logprobs": [-1.2e-05, -3e-07, -0.5, 1e16], "n": 2**70}]))
    monkeypatch.setattr(canonical, "_READ", None)  # a read-back would raise
    assert _msgspec_form(value, decoded=True) == reference(value)
    with pytest.raises(AttributeError):  # the proof is only taken for decoded values
        _msgspec_form(value)
    inside = msgspec.json.decode(reference(["\u001e7", "x:1e-7 0.00001", 1e-7, 1.5e-5]))
    assert _msgspec_form(inside, decoded=True) == reference(inside)  # text kept, no read-back
    escaped = msgspec.json.decode(reference(["line\n1e-7", "a\\b 0.00001", 1e-7, 1.5e-5]))
    assert b"\\" in msgspec.json.encode(escaped)  # escapes, none of them a quote
    assert _msgspec_form(escaped, decoded=True) == reference(escaped)
    # Escaped quotes, and a string that ends in an escaped backslash right before its closing
    # quote (masked from the left, the pair is a backslash's; the quote after it closes).
    for texts in (['say "1e-7"', 1e-7], ['a\\', "1e-7 0.00001", 1.5e-5, 'b\\"0.00002"', 3e-7],
                  ['\\"', ' 1e-7 "', 1e-7], ['x\\\\', '"', "2e16", 2e16]):
        quoted = msgspec.json.decode(reference(texts))
        assert _msgspec_form(quoted, decoded=True) == reference(quoted)
