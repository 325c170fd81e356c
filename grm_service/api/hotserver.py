"""uvicorn's httptools protocol, with one change for the hot routes: their request/response
exchange skips uvicorn's per-request ASGI cycle and the answer leaves in ONE write.

Why: uvicorn writes a response's head and body in two `send` calls and builds a cycle object,
an event and several checks per request; on the gateway's hot path that was the largest single
cost left (benchmarks/RESULTS.md, issue 14). The app is still called as ASGI (`HotPath` in
`api/hotpath.py`, with its FastAPI fallback), through a minimal receive/send pair.

Taken this way only: `POST` to a hot route, HTTP/1.x, a Content-Length within the body limit,
no `Expect: 100-continue`, no upgrade, and no earlier request of the connection still in flight.
Anything else goes through uvicorn unchanged. Pipelined requests behind a hot one wait in
uvicorn's own pipeline queue (this exchange stands in as the in-flight cycle).
"""

from __future__ import annotations

import asyncio
import http
import logging
from typing import Any, cast

import httptools
from uvicorn._types import HTTPScope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from grm_service.api.hotpath import CHAT, CLASSIFY

log = logging.getLogger(__name__)

_HOT_URLS = frozenset({CHAT.encode(), CLASSIFY.encode()})


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


_STATUS = {status: _status_line(status) for status in range(100, 600)}


class _Exchange:
    """One hot request on a connection. Stands in for uvicorn's cycle while in flight, so it has
    the attributes the protocol reads from one (`response_complete`, `keep_alive`,
    `disconnected`, `message_event`)."""

    def __init__(self, proto: HotHttpProtocol, scope: dict[str, Any], keep_alive: bool) -> None:
        self.proto = proto
        self.scope = scope
        self.keep_alive = keep_alive
        self.chunks: list[bytes] = []
        self.response_complete = False
        self.disconnected = False
        self.message_event = asyncio.Event()  # set by the protocol when the client goes away
        self._body_sent = False
        self._status = 500
        self._headers: list[tuple[bytes, bytes]] = []
        self._parts: list[bytes] = []

    async def run(self) -> None:
        try:
            await self.proto.app(self.scope, self.receive, self.send)
        except Exception:
            log.exception("exception in the hot path")
            if not self.response_complete:
                self._status, self._headers, self._parts = 500, [], [b"Internal Server Error"]
                self.keep_alive = False
                self._write()

    async def receive(self) -> dict[str, Any]:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": b"".join(self.chunks), "more_body": False}
        await self.message_event.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self._status = message["status"]
            self._headers = list(message.get("headers", []))
            return
        if message["type"] == "http.response.body" and not self.response_complete:
            self._parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                self._write()

    def _write(self) -> None:
        """Status line, headers and body in one write, then what uvicorn does after a response:
        close, or arm keep-alive and start the next pipelined request."""
        proto, body = self.proto, b"".join(self._parts)
        self.response_complete = True
        if proto.access_log:
            scope = cast(HTTPScope, self.scope)
            proto.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(scope),
                                     scope["method"], get_path_with_query_string(scope),
                                     scope["http_version"], self._status)
        head = [_STATUS[self._status]]
        has_length = False
        for name, value in [*proto.server_state.default_headers, *self._headers]:
            if b"\r" in value or b"\n" in value:  # never let a value split the response
                raise RuntimeError("invalid HTTP header value")
            has_length = has_length or name.lower() == b"content-length"
            head += [name, b": ", value, b"\r\n"]
        if not has_length:
            head += [b"content-length: ", str(len(body)).encode(), b"\r\n"]
        if not self.keep_alive:
            head.append(b"connection: close\r\n")
        head += [b"\r\n", body]
        if self.disconnected or proto.transport.is_closing():
            return
        proto.transport.write(b"".join(head))
        if self.keep_alive:
            proto.on_response_complete()
        else:
            proto.transport.close()


class HotHttpProtocol(HttpToolsProtocol):
    """Set `body_limit` on a subclass (`hot_protocol`): a larger declared body is left to
    uvicorn, where the app refuses it without this protocol buffering it first."""

    body_limit = 0

    def on_headers_complete(self) -> None:
        if not self._hot():
            super().on_headers_complete()
            return
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]
        version = self.parser.get_http_version()
        scope["method"] = "POST"
        scope["http_version"] = version
        parsed = httptools.parse_url(self.url)
        scope["path"] = self.root_path + parsed.path.decode("ascii")
        scope["raw_path"] = self.root_path.encode("ascii") + parsed.path
        scope["query_string"] = parsed.query or b""
        keep_alive = version != "1.0" and self.parser.should_keep_alive()
        self.cycle = _Exchange(self, scope, keep_alive)  # type: ignore[assignment]

    def _hot(self) -> bool:
        if self.parser.get_method() != b"POST" or self.url.split(b"?", 1)[0] not in _HOT_URLS:
            return False
        if self.expect_100_continue or self.parser.should_upgrade():
            return False
        if self.cycle is not None and not self.cycle.response_complete:
            return False  # pipelined behind a request in flight: uvicorn queues it
        length = next((v for k, v in self.headers if k == b"content-length"), None)
        return length is not None and length.isdigit() and int(length) <= self.body_limit

    def on_body(self, body: bytes) -> None:
        exchange = self.cycle
        if isinstance(exchange, _Exchange):
            exchange.chunks.append(body)
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        exchange = self.cycle
        if not isinstance(exchange, _Exchange):
            super().on_message_complete()
            return
        task = self.loop.create_task(exchange.run())
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)


def hot_protocol(body_limit: int) -> type[HotHttpProtocol]:
    """The protocol class for `uvicorn.Config(http=...)`."""
    return cast(type[HotHttpProtocol],
                type("GrmHttpProtocol", (HotHttpProtocol,), {"body_limit": body_limit}))
