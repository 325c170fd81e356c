"""What is wrong with a request body that is not JSON, worded for the person who fixes it: the
place (line, column and byte), what the parser expected there, and the text around it; a body
cut short says that it ended early, and where.

Only refused bodies come here: the body is parsed once more by the stdlib, whose error gives
the place and the reason, so the parsers of the hot path keep their speed. Every edge (the
one-write exchange, the hot path as ASGI, the FastAPI routes, `/v1/score`'s own reader) refuses
a body through `invalid_json`, so each says the same words.
"""

from __future__ import annotations

import codecs
import json
import re

from grm_service.errors import InvalidJson

_EXCERPT = 24  # characters shown on each side of the place
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_VALUE = "a JSON value (object, array, string, number, true, false or null)"
_EXPECTED = {
    "Expecting ':' delimiter": "':'",
    "Expecting value": _VALUE,
    "Extra data": "the end of the body (one JSON value only)",
    "Invalid control character at": "an escaped control character (\\n, \\t or \\u00XX)",
    "Invalid \\escape": "an escape among \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX",
    "Invalid \\uXXXX escape": "four hex digits after \\u",
}


def invalid_json(raw: bytes) -> InvalidJson:
    """The refusal of `raw`, a body a JSON parser refused."""
    bom = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        text = raw[bom:].decode("utf-8")
    except UnicodeDecodeError as err:
        return _not_utf8(raw, bom + err.start)
    if not text.strip():
        return InvalidJson("the body is empty: send one JSON object")
    try:
        json.loads(text)
    except json.JSONDecodeError as err:
        return _described(text, err, bom)
    except RecursionError:
        return InvalidJson("the body nests too deep for its parser")
    return InvalidJson("the body is not JSON this route reads (RFC 8259, UTF-8)")


def _described(text: str, err: json.JSONDecodeError, bom: int) -> InvalidJson:
    pos = err.pos
    if err.msg.startswith("Unterminated string"):
        end = len(text)
        return InvalidJson(f"the body ended early at {_place(text, end, bom)}, inside the string "
                           f"that starts at line {err.lineno}, column {err.colno}: expected a "
                           f"closing '\"' after {_before(text, end)}")
    expected = _expected(err.msg, text, pos)
    if not text[pos:].strip():
        return InvalidJson(f"the body ended early at {_place(text, pos, bom)}: expected "
                           f"{expected} after {_before(text, pos)}")
    return InvalidJson(f"invalid JSON at {_place(text, pos, bom)}: expected {expected}, found "
                       f"{_after(text, pos)} after {_before(text, pos)}")


def _not_utf8(raw: bytes, start: int) -> InvalidJson:
    text = raw[:start].decode("utf-8")
    return InvalidJson(f"the body is not UTF-8: byte 0x{raw[start]:02x} at "
                       f"{_place(text, len(text), 0)} starts no UTF-8 character; send JSON "
                       f"as UTF-8 (after {_before(text, len(text))})")


def _place(text: str, pos: int, bom: int) -> str:
    line = text.count("\n", 0, pos) + 1
    column = pos - text.rfind("\n", 0, pos)
    return f"line {line}, column {column} (byte {bom + len(text[:pos].encode())})"


def _expected(msg: str, text: str, pos: int) -> str:
    if msg == "Expecting ',' delimiter":
        return "',' or '}'" if _innermost(text, pos) == "{" else "',' or ']'"
    if msg.startswith("Expecting property name"):
        first = text[:pos].rstrip().endswith("{")
        return "a property name in double quotes" + (" or '}'" if first else "")
    return _EXPECTED.get(msg, msg.lower())


def _innermost(text: str, pos: int) -> str:
    """The opening bracket of the array or object that `pos` is in ("" at the top)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text[:pos]))
    depth = 0
    for char in reversed(brackets):
        if char in "]}":
            depth += 1
        elif depth:
            depth -= 1
        else:
            return char
    return ""


def _before(text: str, pos: int) -> str:
    start = max(0, pos - _EXCERPT)
    return repr(("..." if start else "") + text[start:pos])


def _after(text: str, pos: int) -> str:
    return repr(text[pos:pos + _EXCERPT] + ("..." if len(text) > pos + _EXCERPT else ""))
