"""Lone UTF-16 surrogates in a JSON body, found on its bytes before it is parsed.

JSON's grammar lets a string escape half of a surrogate pair (`"\\ud800"`), and Python's
parser (with `surrogatepass`, as `json.loads` decodes bytes) also reads the UTF-8 form of one
(`ED A0 80`), which is not valid UTF-8. Either becomes a `str` that cannot be encoded again:
the canonical JSON, the request digest, the send to the replica and any error that echoes the
input would fail on it. Such a body names no text at all (RFC 8259 section 8.2; I-JSON refuses
it), so it is refused here, whole, with the offset of the first bad sequence.

Cost: a body with no backslash and no 0xED byte (every base64 image) is two memchr passes
(0.06 ms for a 2.7 MB page scan); one with escapes, a memchr step per escape, or for many
escapes one regex pass.
"""

from __future__ import annotations

import re

from grm_service.errors import InvalidRequest

_FEW_ESCAPES = 1024
_HEX4 = re.compile(rb"[0-9a-fA-F]{4}")
# UTF-8 of U+D800..U+DFFF: lead byte ED, then A0..BF (Hangul, U+D000..U+D7FF, has 80..9F).
_ENCODED = re.compile(rb"\xed[\xa0-\xbf]")
# A \u escape of a surrogate, preceded by an even run of backslashes (an odd run escapes the
# backslash itself): a high half with its low half after it, a high half alone, or a low half.
_ESCAPED = re.compile(
    rb"(?<!\\)(?:\\\\)*\\u(?:([dD][89abAB][0-9a-fA-F]{2})(\\u[dD][c-fC-F][0-9a-fA-F]{2})?"
    rb"|[dD][c-fC-F][0-9a-fA-F]{2})")


def check_surrogates(raw: bytes | bytearray, escaped: bool | None = None) -> None:
    """InvalidRequest naming the first lone surrogate in `raw`, escaped or encoded. `escaped`:
    whether `raw` holds a backslash, where the caller has looked (None: look here)."""
    # `find`, not `in`, for every test of bytes in bytes on the request path: `in` first tries
    # the needle as an int, and formats (then drops) a TypeError for each bytes needle.
    if raw.find(b"\xed") >= 0:
        found = _ENCODED.search(raw)
        if found is not None:
            raise InvalidRequest(
                f"body byte {found.start()}: {found.group().hex(' ').upper()} ... is a UTF-16 "
                "surrogate encoded as UTF-8, which is not valid UTF-8: send the text as UTF-8")
    if escaped is None:
        escaped = raw.find(b"\\") >= 0
    at = _lone_escape(raw) if escaped else None
    if at is not None:
        escape = raw[at:at + 6].decode("ascii", "replace")
        raise InvalidRequest(
            f"body byte {at}: the JSON escape {escape} is half of a UTF-16 surrogate pair with "
            "no other half: a string must hold whole characters (a pair such as "
            "\\ud83d\\ude00, or the character itself in UTF-8)")


def _lone_escape(raw: bytes | bytearray) -> int | None:
    """Offset of the first escape of a lone surrogate half. Few escapes (an image body's text
    parts) are stepped through by memchr; past `_FEW_ESCAPES`, one regex pass is cheaper (a
    count or a two-byte search for `\\u` would cost ~1-2 ms over a 2.7 MB image)."""
    pos = raw.find(b"\\")
    for _ in range(_FEW_ESCAPES):
        if pos == -1:
            return None
        unit = _unit(raw, pos)
        if unit is None or not 0xD800 <= unit <= 0xDFFF:
            pos = raw.find(b"\\", pos + 2)  # past the escaped character: `\\\\` is one escape
            continue
        low = _unit(raw, pos + 6)
        if unit >= 0xDC00 or low is None or not 0xDC00 <= low <= 0xDFFF:
            return pos
        pos = raw.find(b"\\", pos + 12)
    for found in _ESCAPED.finditer(raw):
        if found.group(2) is None:  # a low half alone, or a high half without its low
            return found.end() - 6
    return None


def _unit(raw: bytes | bytearray, pos: int) -> int | None:
    """The UTF-16 code unit of the `\\uXXXX` escape at `pos`, if there is one."""
    if raw[pos:pos + 2] != b"\\u" or not _HEX4.fullmatch(raw, pos + 2, pos + 6):
        return None
    return int(raw[pos + 2:pos + 6], 16)
