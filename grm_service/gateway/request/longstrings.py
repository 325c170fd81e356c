"""Long JSON strings (inline images) at the speed of copying them.

An image request is one multi-megabyte base64 string and a few small fields. The `json`
module's C code passes every character of a string through a per-character loop, twice per
request on the gateway: parsing it (~1 ns a byte) and writing the canonical JSON that the
route digest and request digest hash (`ensure_ascii=False` re-escaping: ~5 ns a byte, 13 ms for
a 2.7 MB page scan). Both loops look for the same few characters: a string holding no quote, no
backslash and no control character parses to its bytes, and its JSON form is those bytes
between quotes. `loads` and `canonical` prove that with whole-buffer operations (memchr, one
numpy min) and copy such strings as they are; every other value still goes through `json`.

Same values, same bytes, by construction (and by `tests/unit/gateway/request/test_longstrings.py`):

- `loads(raw)`: each long run between two quotes that is a plain string is replaced by `NaN`,
  the rest is parsed by `json`, and its `parse_constant` hook hands back the strings in order.
  A `NaN` literal parsed as a value where the string stood means the string literal parses
  there too, to those bytes; when the skeleton holds any other `NaN` text, or not every
  string came back as a value, or the skeleton does not parse, the whole body is parsed as is.
- the canonical JSON (`grm_service.canonical.canonical_parts`, the one module that writes it)
  takes the `Lifted` strings' bytes as they are, with no check and no copy: a lifted string
  is known to need no escaping, and its bytes are still in the body read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from grm_service.canonical import LONG as LONG  # lifted here, spliced there: one threshold
from grm_service.canonical import has_control

_TOKEN = b"NaN"  # stands for a lifted string in the text parsed; a client's NaN is refused
_VALUE_ENDS = b",]}"


class _Refused(ValueError):
    """A NaN or Infinity literal in the body."""


class Lifted:
    """The strings one `loads` call lifted, by identity, with their bytes in the body read:
    valid UTF-8 with no quote, backslash or control character, i.e. their JSON form."""

    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        # The string itself is kept: its id cannot be reused by another object meanwhile.
        self._by_id: dict[int, tuple[str, memoryview]] = {}

    def add(self, text: str, data: memoryview) -> None:
        self._by_id[id(text)] = (text, data)

    def bytes_of(self, text: str) -> memoryview | None:
        entry = self._by_id.get(id(text))
        return entry[1] if entry is not None and entry[0] is text else None


# ---- parse ----------------------------------------------------------------------------------

def loads(raw: bytes | bytearray, parse_float: Callable[[str], Any] = float,
          lifted: Lifted | None = None, escaped: bool = True,
          strings: list[tuple[int, int]] | None = None) -> Any:
    """`json.loads(raw)` with `parse_float`, refusing NaN/Infinity literals with a ValueError
    (so does any invalid JSON or UTF-8). The strings lifted out of the parse go to `lifted`.

    What the caller's own scan found, so that no pass over an image (~60 us per 2.7 MB) is
    made twice: `escaped=False`, no backslash in `raw`; `strings`, the insides (start, end) of
    its strings of `LONG` bytes or more (`shape.check_json_shape`), else every run
    between two quotes that long is tried."""
    runs = _gaps(raw) if strings is None else strings
    spans = [span for span in runs if _plain_value(raw, *span, escaped)]
    if spans:
        skeleton, texts = _lift(raw, spans)
        if texts is not None:
            given = iter(texts)
            decoder = json.JSONDecoder(parse_float=parse_float,
                                       parse_constant=lambda name: _lifted(name, given))
            try:
                value = decoder.decode(skeleton.decode())
            except Exception:  # the exact parse below decides what raw is
                pass
            else:
                if next(given, None) is None:
                    if lifted is not None:
                        view = memoryview(raw)
                        for text, (start, end) in zip(texts, spans, strict=True):
                            lifted.add(text, view[start:end])
                    return value
    return json.JSONDecoder(parse_float=parse_float, parse_constant=_refuse).decode(raw.decode())


def _refuse(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number")


def _lifted(name: str, given: Any) -> Any:
    if name != "NaN":
        raise _Refused(f"{name} is not a JSON number")
    return next(given)


def _gaps(raw: bytes | bytearray) -> list[tuple[int, int]]:
    """(start, end) of every run of LONG bytes or more between two consecutive quotes.

    Steps by the window's last quote: two steps move past at least LONG bytes, so a body of
    many small strings costs len/LONG steps, not one per string.
    """
    gaps = []
    pos = raw.find(b'"')
    while pos != -1:
        last = raw.rfind(b'"', pos + 1, pos + 1 + LONG)
        if last != -1:
            pos = last  # a run starting before `last` ends inside the window: short
            continue
        end = raw.find(b'"', pos + 1)
        if end == -1:
            break
        gaps.append((pos + 1, end))
        pos = end
    return gaps


def _plain_value(raw: bytes | bytearray, start: int, end: int, escaped: bool = True) -> bool:
    """The run parses to its own bytes (no escape, no control character) and, if it is a
    string at all, a value (not a key): what a NaN in its place can stand for."""
    after = raw[end + 1:end + 65].lstrip(b" \t\r\n")[:1]
    if not after or after not in _VALUE_ENDS:
        return False
    view = memoryview(raw)[start:end]
    return not (escaped and raw.find(b"\\", start, end) >= 0) and not has_control(view)


def _lift(raw: bytes | bytearray, spans: list[tuple[int, int]],
          ) -> tuple[bytes | bytearray, list[str] | None]:
    """The text with each span and its quotes replaced by NaN, and the spans as strings (None
    when NaN is already in the text: a client's NaN would be taken for a lifted string)."""
    pieces: list[bytes | bytearray] = []
    strings: list[str] = []
    view = memoryview(raw)
    pos = 0
    for start, end in spans:
        pieces += (raw[pos:start - 1], _TOKEN)
        strings.append(str(view[start:end], "utf-8"))
        pos = end + 1
    pieces.append(raw[pos:])
    if any(_TOKEN in piece for piece in pieces[::2]):
        return raw, None
    return b"".join(pieces), strings
