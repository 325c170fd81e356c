"""The one renderer of answers and errors, for every edge: the hot exchange writes a `Reply`
as HTTP/1.1 bytes (`wire`), plain ASGI sends it (`send_reply`), FastAPI returns it
(`ReplyResponse`). A `Reply` is status, headers (content-length included) and body, in the
order starlette's JSONResponse sends them, so every path answers the same bytes.
"""

from __future__ import annotations

import http
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Send

from grm_service.errors import GrmError, InvalidFields, error_body
from grm_service.fingerprint import answer_headers, fingerprint_headers
from grm_service.gateway.request.answer import RESPONSE_JSON, Forwarded, encode_headers, render

Headers = list[tuple[bytes, bytes]]
Reply = tuple[int, Headers, bytes]


def reply(status: int, body: bytes, headers: Mapping[str, str] | None = None,
          content_type: bytes = b"application/json", first: Sequence[tuple[bytes, bytes]] = ()
          ) -> Reply:
    """`first`: header lines already encoded, sent before `headers`."""
    raw = [*first, *encode_headers(headers or {})]
    raw += [(b"content-length", str(len(body)).encode()), (b"content-type", content_type)]
    return status, raw, body


def json_reply(status: int, content: Any, headers: Mapping[str, str] | None = None) -> Reply:
    return reply(status, RESPONSE_JSON.encode(content).encode("utf-8"), headers)


def answer_reply(forwarded: Forwarded) -> Reply:
    """A forwarded answer, its fingerprint in the body and the headers (the lines its stamp
    fixes encoded once, with the stamp)."""
    fields = forwarded.fields
    if forwarded.stamp_headers:
        return reply(200, render(forwarded), answer_headers(fields),
                     first=forwarded.stamp_headers)
    return reply(200, render(forwarded), fingerprint_headers(fields))


def error_reply(err: GrmError, headers: Mapping[str, str] | None = None) -> Reply:
    """Every refusal, whichever edge or route makes it: OpenAI's error object (`error_body`),
    `Retry-After` where the error gives one, then `headers`."""
    retry = {"retry-after": str(max(1, round(err.retry_after)))} if err.retry_after else {}
    return json_reply(err.http_status, error_body(err), {**retry, **(headers or {})})


def validation_reply(errors: Sequence[Mapping[str, Any]]) -> Reply:
    """pydantic's errors as OpenAI's error object, so SDK users read which field is wrong and
    how (an OpenAI client shows `error.message`, not FastAPI's `detail`)."""
    return error_reply(invalid_fields(errors))


def invalid_fields(errors: Sequence[Mapping[str, Any]]) -> InvalidFields:
    problems = []
    for error in errors:
        where = _where(error)
        problems.append(f"{where or 'body'}: {error.get('msg', 'invalid')}")
    param = _where(errors[0]) if errors else None
    return InvalidFields("; ".join(problems) or "invalid request", param or None)


def _where(error: Mapping[str, Any]) -> str:
    return ".".join(str(part) for part in error.get("loc", ()) if part != "body")


class ReplyResponse(Response):
    """A `Reply` as a starlette response, its headers as rendered."""

    def __init__(self, answer: Reply, background: BackgroundTask | None = None) -> None:
        self.status_code, headers, self.body = answer
        self.raw_headers = list(headers)
        self.background = background


async def send_reply(send: Send, answer: Reply) -> None:
    status, headers, body = answer
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


_STATUS = {status: _status_line(status) for status in range(100, 600)}


def wire(answer: Reply, default_lines: bytes, keep_alive: bool) -> bytes:
    """The answer as HTTP/1.1 bytes: status line, the server's default lines (date, server),
    the headers, `connection: close` unless kept alive, the body."""
    status, headers, body = answer
    lines = header_lines(headers)
    # One CR and one LF per line are the ones added here; any other is inside a name or a
    # value, and would split the response.
    if lines.count(b"\r") != len(headers) or lines.count(b"\n") != len(headers):
        raise ValueError("invalid HTTP header value")
    close = b"" if keep_alive else b"connection: close\r\n"
    return b"".join((_STATUS[status], default_lines, lines, close, b"\r\n", body))


def header_lines(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """`name: value` lines, each ended by CRLF (the C join: no Python frame per header)."""
    lines = b"\r\n".join(map(_NAME_VALUE, headers))  # a line is never empty: it has ": "
    return lines + b"\r\n" if lines else b""


_NAME_VALUE = b": ".join
