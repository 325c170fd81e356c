"""THE canonical JSON of a request body: one byte string per logical request.

Route digests (crc32 of it), request digests and fingerprint ids are computed over these bytes, so
they are the service's wire contract: a change here changes every digest and route. The form is
`json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()`, and the
first two writers below run the C encoder json.dumps runs, with its arguments:

- `canonical_json(body)`: that encoder as is, without json.dumps' Python wrapper (~5 us a call);
- `canonical_parts(body, known)`: the same bytes in pieces, for bodies with inline images. The
  encoder's per-character escaping costs ~5 ns a byte (13 ms for a 2.7 MB page scan); a string
  of `LONG` characters or more with nothing to escape is written as a NUL placeholder (a
  character the encoder never writes raw) and its bytes are spliced in at the placeholders
  afterwards, uncopied: the route digest, the request digest and the send to the replica take
  the pieces one after the other. `known` gives the bytes of strings already proven plain
  (`longstrings.Lifted`: strings the parse lifted out of the body read).
- `canonical_value(value)`: the same bytes for a value a JSON parser built (an engine's answer;
  `canonical_body(body)` for a request's body), from msgspec's encoder (~2x faster than the C
  encoder on an answer with 128 logprobs: its floats, integer lists and sorted keys). msgspec
  writes every float with the digits Python's `repr` writes, laid out otherwise in three
  ranges, which are rewritten to Python's layout:
  an exponent of one digit (`1e-7`, Python `1e-07`), a value in [1e-5, 1e-4) (`0.000012`,
  Python `1.2e-05`), a positive exponent (`1e16`, Python `1e+16`). The bytes are then read
  back: they must give the value again, which proves that no rewrite touched a string's text;
  where they do not, the C encoder writes the value. Non-finite floats (msgspec writes
  `null`) and what JSON has no form for (msgspec writes bytes as base64, json.dumps raises)
  read back as something else, and go there too. For a value msgspec's JSON decoder built
  (`decoded`: finite floats and JSON's types only) a cheaper proof replaces the read-back:
  with each escape pair that holds a quote or a backslash masked (`_delimited`), every quote
  left opens or closes a string, so a match with an odd count of such quotes before it is a
  string's text (kept as it is) and one with an even count a number's. The read-back is about
  half the form's cost on an answer with 128 logprobs, and a model's tokens often hold a
  quote: with the read-back taken for those, the response digest was a fifth of the gateway's
  CPU on a VL replica's OCR answers (benchmarks/gpu/RESULTS.md).

`tests/unit/gateway/request/test_longstrings.py` holds the first two to json.dumps on generated
bodies, `tests/unit/test_canonical.py` the third, on generated values and on every range of
floats.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from json.encoder import c_encode_basestring, c_make_encoder  # type: ignore[attr-defined]
from typing import Any, Protocol

import msgspec
import numpy as np

# Strings shorter than this go through the encoder as usual: below it the checks cost more than
# the per-character loop they skip.
LONG = 8192

_ENCODE_DEFAULT = json.JSONEncoder().default  # the TypeError json.dumps raises
_MARK = "\x00"  # the encoder escapes every control character a string holds: never written raw


_MSGSPEC = msgspec.json.Encoder(order="sorted")
_READ = msgspec.json.Decoder()
# A number's exponent of one digit, and a number that starts 0.0000 (a digit before it: the end
# of another number, `10.000012`). The literal comes first, then the look behind: a pattern
# that starts with a literal is searched for it, ~15x faster than one that starts with a look.
# split: text, exponent's sign and first digit, text, ...: "-7" of `1e-7`, "1" of `1e16`
_EXPONENT = re.compile(rb"e(?<=[0-9]e)(-[6-9](?![0-9])|[0-9])")
_MINUS = ord("-")
# split: text, first digit, the rest's digits, text, ...
_FIVE_ZEROS = re.compile(rb"0\.0000(?<![0-9]0\.0000)([0-9])([0-9]*)")


class KnownBytes(Protocol):
    def bytes_of(self, text: str) -> memoryview | None:
        """The string's JSON form without its quotes, where it is known; else None."""


def canonical_json(body: Any) -> bytes:
    """The canonical JSON of `body`."""
    return "".join(_encoder(c_encode_basestring)(body, 0)).encode()


def canonical_body(body: dict[str, Any]) -> bytes:
    """`canonical_json(body)` for a request body, built of JSON's types (a parsed request and
    what the gateway adds to it): msgspec's form with the cheaper proof (`decoded`), ~4 us
    against ~6 on a judge request. A non-finite float is the one such value that proof does
    not cover (msgspec writes it `null`, json.dumps `NaN`), so a form that holds `null` is read
    back instead."""
    fast = _msgspec_form(body, decoded=True)
    if fast is not None and fast.find(b"null") >= 0:
        fast = _read_back(fast, body)  # the quotes' proof holds: its rewrites need no redoing
    return canonical_json(body) if fast is None else fast


def canonical_value(value: Any, decoded: bool = False) -> bytes:
    """`canonical_json(value)`, faster where `value` is what a JSON parser builds; `decoded`:
    msgspec's JSON decoder built it."""
    fast = _msgspec_form(value, decoded)
    return canonical_json(value) if fast is None else fast


def _msgspec_form(value: Any, decoded: bool = False) -> bytes | None:
    """msgspec's bytes of `value` with its floats laid out as Python's; None where they are not
    proven to be `canonical_json(value)`."""
    try:
        data = _MSGSPEC.encode(value)
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError):
        return None
    # The count of string delimiters before a match tells whether it is in a string: there it
    # is text, kept as it is, and the bytes need no read-back.
    parts = _EXPONENT.split(data)
    if len(parts) > 1:
        _exponents(parts, _delimited(parts, data, _EXPONENT) if decoded else None)
        data = b"".join(parts)
    if data.find(b"0.0000") >= 0:  # not `in`: see surrogates.check_surrogates
        parts = _FIVE_ZEROS.split(data)
        _five_zeros(parts, _delimited(parts, data, _FIVE_ZEROS) if decoded else None)
        data = b"".join(parts)
    return data if decoded else _read_back(data, value)


def _read_back(data: bytes, value: Any) -> bytes | None:
    """`data` where it parses to `value` again, else None (a NaN is never equal to itself)."""
    try:
        same = _READ.decode(data) == value
    except (msgspec.DecodeError, RecursionError):
        return None
    return data if same else None


def _delimited(parts: list[bytes], data: bytes, pattern: re.Pattern[bytes]) -> list[bytes]:
    """`parts` (`pattern.split(data)`, `data` msgspec's JSON) with every quote left in their
    text a string's delimiter: where `data` holds a backslash, the same split of `data` with
    each escape pair that holds a quote or a backslash masked. In JSON a backslash is only in a
    string, where it starts an escape of two characters (or six, `\\uXXXX`, with no quote or
    backslash after the first two): masking the pairs of backslashes from the left first leaves
    each escaped quote as a backslash and the quote. The patterns look at digits, `e`, `-` and
    `.` alone, so the masked bytes split at the same matches. Most answers hold no backslash,
    which one memchr finds."""
    if data.find(b"\\") < 0:
        return parts
    return pattern.split(data.replace(b"\\\\", b"__").replace(b'\\"', b"__"))


def _exponents(parts: list[bytes], texts: list[bytes] | None) -> None:
    """`_EXPONENT.split`'s matches in Python's form: `e-07` for `e-7`, `e+5` for `e5`; with
    `texts` (`_delimited`), those in a string kept."""
    quotes = 0
    for i in range(1, len(parts), 2):
        sign_digit = parts[i]
        if texts is not None:
            quotes += texts[i - 1].count(b'"')
            if quotes & 1:
                parts[i] = b"e" + sign_digit
                continue
        parts[i] = b"e-0" + sign_digit[1:] if sign_digit[0] == _MINUS else b"e+" + sign_digit


def _five_zeros(parts: list[bytes], texts: list[bytes] | None) -> None:
    """`_FIVE_ZEROS.split`'s matches in Python's form: `1.2e-05` for `0.000012`; with `texts`
    (`_delimited`), those in a string kept."""
    quotes = 0
    for i in range(1, len(parts), 3):
        if texts is not None:
            quotes += texts[i - 1].count(b'"')
            if quotes & 1:
                parts[i] = b"0.0000" + parts[i]
                continue
        rest = parts[i + 1]
        if rest:
            parts[i] += b"."
            parts[i + 1] = rest + b"e-05"
        else:
            parts[i + 1] = b"e-05"


def canonical_parts(body: Any, known: KnownBytes | None = None) -> list[bytes | memoryview]:
    """`canonical_json(body)` in pieces that concatenate to it, the long strings uncopied."""
    spliced: list[bytes | memoryview] = []

    def encode_str(text: str) -> str:
        if len(text) >= LONG:
            data: bytes | memoryview | None = None if known is None else known.bytes_of(text)
            if data is None:
                data = _plain_bytes(text)
            if data is not None:
                spliced.append(data)
                return _MARK
        return c_encode_basestring(text)  # type: ignore[no-any-return]

    encoded = "".join(_encoder(encode_str)(body, 0)).encode()
    if not spliced:
        return [encoded]
    parts = encoded.split(_MARK.encode())
    out: list[bytes | memoryview] = [parts[0]]
    for data, after in zip(spliced, parts[1:], strict=True):
        out += (b'"', data, b'"', after)
    return out


def has_control(data: bytes | memoryview) -> bool:
    """A byte below 0x20: a character JSON must escape (one numpy min, not a Python loop)."""
    return int(np.frombuffer(data, dtype=np.uint8).min()) < 0x20


def _encoder(encode_str: Callable[[str], str]) -> Callable[[Any, int], Any]:
    """The encoder json.dumps builds for the canonical options (JSONEncoder.iterencode): a fresh
    `markers` dict (check_circular), its default, no indent, the separators, sort_keys, no
    skipkeys, allow_nan; `encode_str` writes each string (key or value)."""
    encoder: Callable[[Any, int], Any] = c_make_encoder(
        {}, _ENCODE_DEFAULT, encode_str, None, ":", ",", True, False, True)
    return encoder


def _plain_bytes(text: str) -> bytes | None:
    """The string's bytes when they are its JSON form: ASCII (isascii is O(1): the string
    knows its width) with no quote, backslash or control character."""
    if not text.isascii():
        return None
    data = text.encode()
    if data.find(b'"') >= 0 or data.find(b"\\") >= 0 or has_control(data):
        return None
    return data
