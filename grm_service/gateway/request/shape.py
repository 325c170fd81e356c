"""A JSON body's shape on its bytes, before any parser builds (or recurses into) it: nesting
depth and value count bounded, lone surrogates refused (`surrogates.py`), the long strings
found for the parse (`longstrings.loads`)."""

from __future__ import annotations

from array import array
from itertools import accumulate

from grm_service.canonical import LONG
from grm_service.errors import OverLimit, TooLarge
from grm_service.gateway.request.surrogates import check_surrogates


def check_json_shape(raw: bytes | bytearray, max_depth: int, max_values: int,
                     escaped: bool | None = None) -> list[tuple[int, int]] | None:
    """Bound nesting and value count of a JSON body on its bytes, before it is parsed, and
    refuse lone surrogates (`surrogates.py`): what every edge checks of every body it reads.
    `escaped`: whether `raw` holds a backslash, where the caller has looked.

    Runs at memchr speed on the bodies that matter for cost (a few long strings: images);
    a body of many small strings costs about a tenth of its parse. Returns the insides
    (start, end) of the body's strings of `LONG` bytes or more where the scan went string by
    string (a body of few strings), for the parse (`longstrings.loads`); else None.
    """
    check_surrogates(raw, escaped)
    if len(raw) <= _SMALL_BODY and raw.count(b"{") + raw.count(b"[") <= max_depth:
        return None  # depth <= brackets, values < bytes: nothing to scan
    outside, long_strings = _outside_strings(raw)
    values, depth = _shape_of(outside)
    if values > max_values:
        raise TooLarge(f"body has about {values} JSON values; the limit is {max_values} "
                       "(GRM_MAX_JSON_VALUES)")
    if depth > max_depth:
        raise OverLimit(f"body nests {depth} levels deep; the limit is {max_depth} "
                        "(GRM_MAX_JSON_DEPTH)")
    return long_strings


def json_shape(raw: bytes | bytearray) -> tuple[int, int]:
    """(an upper bound on values and keys, the nesting depth) of a JSON text."""
    return _shape_of(_outside_strings(raw)[0])


def _shape_of(outside: bytes) -> tuple[int, int]:
    # A value after the first in a container follows a comma, a key precedes a colon.
    values = outside.count(b",") + outside.count(b":") + outside.count(b"{") + \
        outside.count(b"[") + 1
    return values, _max_depth(outside)


# Below this size counting brackets is cheaper than finding strings (the request hot path).
_SMALL_BODY = 4096
# Strings found one by one (memchr) up to this many; past it, one split is cheaper per string.
_FEW_STRINGS = 256


def _outside_strings(raw: bytes | bytearray) -> tuple[bytes, list[tuple[int, int]] | None]:
    """The JSON text without its strings (quotes and insides), so brackets and commas left
    are structure; and the insides of its closed strings of `LONG` bytes or more, where every
    string was found one by one (else None)."""
    pieces: list[bytes | bytearray] = []
    long_strings: list[tuple[int, int]] = []
    pos = 0
    for _ in range(_FEW_STRINGS):
        start = raw.find(b'"', pos)
        if start == -1:
            pieces.append(raw[pos:])
            return b"".join(pieces), long_strings
        pieces.append(raw[pos:start])
        pos = _string_end(raw, start + 1) + 1
        if pos - start - 2 >= LONG and pos <= len(raw):
            long_strings.append((start + 1, pos - 1))
    rest = raw[pos:]
    if b"\\" in rest:  # escapes first: an escaped quote does not end a string
        rest = rest.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(pieces) + b"".join(rest.split(b'"')[::2]), None


def _string_end(raw: bytes | bytearray, pos: int) -> int:
    """Index of the quote closing the string whose inside starts at pos (len(raw) if none)."""
    while True:
        end = raw.find(b'"', pos)
        if end == -1:
            return len(raw)  # unterminated: the parser refuses it
        before = end - 1
        while before >= pos and raw[before] == 0x5C:  # a run of backslashes
            before -= 1
        if (end - 1 - before) % 2 == 0:
            return end
        pos = end + 1


# Opening brackets -> +1, closing -> -1 (0xff as a signed byte); everything else dropped.
_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[{]}")


def _max_depth(outside: bytes) -> int:
    steps = array("b", outside.translate(_BRACKETS, _NOT_BRACKETS))
    return max(accumulate(steps), default=0)
