"""THE canonical JSON of a request body: one byte string per logical request.

Routing keys (crc32 of it), request digests and fingerprint ids are computed over these bytes, so
they are the service's wire contract: a change here changes every key and digest. The form is
`json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()`, and both
writers below run the C encoder json.dumps runs, with its arguments:

- `canonical_json(body)`: that encoder as is, without json.dumps' Python wrapper (~5 us a call);
- `canonical_parts(body, known)`: the same bytes in pieces, for bodies with inline images. The
  encoder's per-character escaping costs ~5 ns a byte (13 ms for a 2.7 MB page scan); a string
  of `LONG` characters or more with nothing to escape is written as a NUL placeholder (a
  character the encoder never writes raw) and its bytes are spliced in at the placeholders
  afterwards, uncopied: the routing key, the request digest and the send to the replica take
  the pieces one after the other. `known` gives the bytes of strings already proven plain
  (`longstrings.Lifted`: strings the parse lifted out of the body read).

`tests/unit/gateway/request/test_longstrings.py` holds both to json.dumps on generated bodies.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import c_encode_basestring, c_make_encoder  # type: ignore[attr-defined]
from typing import Any, Protocol

import numpy as np

# Strings shorter than this go through the encoder as usual: below it the checks cost more than
# the per-character loop they skip.
LONG = 8192

_ENCODE_DEFAULT = json.JSONEncoder().default  # the TypeError json.dumps raises
_MARK = "\x00"  # the encoder escapes every control character a string holds: never written raw


class KnownBytes(Protocol):
    def bytes_of(self, text: str) -> memoryview | None:
        """The string's JSON form without its quotes, where it is known; else None."""


def canonical_json(body: Any) -> bytes:
    """The canonical JSON of `body`."""
    return "".join(_encoder(c_encode_basestring)(body, 0)).encode()


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
    if b'"' in data or b"\\" in data or has_control(data):
        return None
    return data
