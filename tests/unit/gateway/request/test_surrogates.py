"""`check_surrogates` refuses exactly the bodies whose parsed strings cannot be encoded again:
the reference is `json.loads(raw)` (which reads bytes with `surrogatepass`) followed by the
canonical JSON's `.encode()`."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grm_service.canonical import canonical_json
from grm_service.errors import InvalidRequest
from grm_service.gateway.request.shape import check_json_shape
from grm_service.gateway.request.surrogates import check_surrogates


def encodable(raw: bytes) -> bool:
    """What the rest of the gateway would find: the body parses to text it can write back."""
    try:
        canonical_json(json.loads(raw))
    except UnicodeEncodeError:
        return False
    return True


@pytest.mark.parametrize(("raw", "where"), [
    (rb'{"a":"\ud800"}', "byte 6: the JSON escape \\ud800"),
    (rb'{"a":"x\uDBFFy"}', "byte 7: the JSON escape \\uDBFF"),
    (rb'{"a":"\udc00"}', "\\udc00 is half"),  # a low half alone
    (rb'{"a":"\ude00\ud83d"}', "\\ude00"),  # both halves, in the wrong order
    (rb'{"a":"\ud83d\ud83d\ude00"}', "byte 6: the JSON escape \\ud83d"),
    (rb'{"a":"\\\ud800"}', "\\ud800"),  # an escaped backslash, then the escape
    (rb'{"\ud800":1}', "\\ud800"),  # in a key
    (b'{"a":"' + b"\\n" * 2000 + rb'\ud800"}', "byte 4006: the JSON escape"),  # many escapes
    (b'{"a":"\xed\xa0\x80"}', "byte 6: ED A0 ... is a UTF-16 surrogate encoded as UTF-8"),
    (b'{"a":"\xed\xbf\xbf"}', "encoded as UTF-8"),
])
def test_lone_surrogates_are_refused_naming_where(raw: bytes, where: str) -> None:
    assert not encodable(raw)
    with pytest.raises(InvalidRequest, match=where.replace("\\", "\\\\")):
        check_surrogates(raw)
    with pytest.raises(InvalidRequest):  # what each edge calls on every body it reads
        check_json_shape(raw, 64, 1_000_000)


@pytest.mark.parametrize("raw", [
    rb'{"a":"\ud83d\ude00"}',  # a pair, as json.dumps (ensure_ascii) writes an emoji
    rb'{"a":"\uD83D\uDE00\ud800\udc00"}',
    rb'{"a":"\\ud800"}',  # an escaped backslash and the letters ud800: no escape
    b'{"a":"' + b"\\\\ud800 \\ud83d\\ude00 " * 600 + b'"}',  # many escapes: the regex pass
    rb'{"a":"\\\\ud800"}',
    '{"a":"\U0001f600 \ud55c\uad6d\uc5b4 \ud7a3"}'.encode(),  # Hangul: ED 80..9F lead bytes
    rb'{"a":"\u00e9\ud7ff\ue000"}',  # next to the surrogate range
    b'{"a":"' + b"QUJD" * 100_000 + b'"}',  # a base64 image: nothing to look at
])
def test_whole_characters_pass(raw: bytes) -> None:
    assert encodable(raw)
    check_surrogates(raw)


_TEXT = st.lists(st.one_of(
    st.sampled_from(["\\ud800", "\\udfff", "\\ud83d\\ude00", "\\\\", "\\u0041", "\\n", "u", "d",
                     "8", "0", "a", "\ud55c", "\U0001f600", "\ud800", "\udc80"]),
    st.text(max_size=3)), max_size=12).map("".join)


@given(_TEXT)
def test_refused_exactly_when_the_parsed_text_cannot_be_written(text: str) -> None:
    raw = ('{"k":"' + text.replace('"', "") + '"}').encode("utf-8", "surrogatepass")
    try:
        json.loads(raw)
    except ValueError:
        return  # not JSON: the parser refuses it
    refused = _refused(raw)
    assert refused == (not encodable(raw)), raw


def _refused(raw: bytes) -> Any:
    try:
        check_surrogates(raw)
    except InvalidRequest:
        return True
    return False
