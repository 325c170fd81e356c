"""uvicorn's httptools protocol, with one change for the hot routes: their request/response
exchange skips ASGI and uvicorn's per-request cycle, and the answer leaves in ONE write.

Why: uvicorn writes a response's head and body in two `send` calls, and an ASGI exchange builds
message dicts, receive/send coroutines and a cycle object per request; on the gateway's hot path
that was a large share of the CPU per request (benchmarks/RESULTS.md, issue 14). Here the
protocol hands the body to `HotPath.serve` and writes the reply it returns.

Taken this way only: `POST` to a hot route, HTTP/1.x, a Content-Length within the body limit,
no `Expect: 100-continue`, no upgrade, no earlier request of the connection still in flight, a
request `HotPath.admit` takes (key, content type, size), an app that is the `HotPath` itself
(no uvicorn middleware around it, as with proxy headers) and no access log. Anything else goes
through uvicorn unchanged. A body `HotPath.serve` leaves to FastAPI gets a uvicorn cycle of its
own, body included. Pipelined requests behind a hot one wait in uvicorn's own pipeline queue
(the exchange stands in as the in-flight cycle).
"""

from __future__ import annotations

import asyncio
import http
import logging
from typing import Any, cast

import httptools
from uvicorn._types import ASGI3Application, HTTPScope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from grm_service.gateway.edge.hotpath import CHAT, CLASSIFY, HotPath, Reply, _Request
from grm_service.gateway.request.proxy import Gateway

log = logging.getLogger(__name__)

_HOT_URLS = frozenset({CHAT.encode(), CLASSIFY.encode()})
_FAILED: Reply = (500, [(b"content-length", b"21")], b"Internal Server Error")


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

    def __init__(self, proto: HotHttpProtocol, hot: HotPath, admitted: tuple[Gateway, _Request],
                 scope: dict[str, Any], keep_alive: bool) -> None:
        self.proto = proto
        self.hot = hot
        self.admitted = admitted
        self.scope = scope  # uvicorn's, for a body that goes to FastAPI after all
        self.path = CHAT if scope["path"] == CHAT else CLASSIFY
        self.keep_alive = keep_alive
        self.chunks: list[bytes] = []
        self.response_complete = False
        self.disconnected = False
        self._event: asyncio.Event | None = None

    @property
    def message_event(self) -> asyncio.Event:
        # Only the protocol sets it (the client went away); nothing here waits on it.
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    async def run(self) -> None:
        body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        try:
            reply = await self.hot.serve(self.path, *self.admitted, body)
            if reply is None:
                await self._to_fastapi(body)
            else:
                self._write(reply)
        except Exception:
            log.exception("exception in the hot path")
            if not self.response_complete:
                self.keep_alive = False
                self._write(_FAILED)

    def _write(self, reply: Reply) -> None:
        """Status line, headers and body in one write, then what uvicorn does after a response:
        close, or arm keep-alive and start the next pipelined request."""
        proto = self.proto
        status, headers, body = reply
        lines = b"".join([name + b": " + value + b"\r\n" for name, value in headers])
        # One CR and one LF per line are the ones added here; any other is inside a name or a
        # value, and would split the response.
        if lines.count(b"\r") != len(headers) or lines.count(b"\n") != len(headers):
            raise RuntimeError("invalid HTTP header value")
        close = b"" if self.keep_alive else b"connection: close\r\n"
        data = b"".join((_STATUS[status], proto.default_lines(), lines, close, b"\r\n", body))
        self.response_complete = True
        if self.disconnected or proto.transport.is_closing():
            return
        proto.transport.write(data)
        if self.keep_alive:
            proto.on_response_complete()
        else:
            proto.transport.close()

    async def _to_fastapi(self, body: bytes) -> None:
        """The request as uvicorn would have run it: its scope, its cycle, the body given."""
        proto = self.proto
        given = asyncio.Event()
        given.set()  # the body is all here: the app's first receive() returns it at once
        cycle = RequestResponseCycle(
            scope=cast(HTTPScope, self.scope), transport=proto.transport, flow=proto.flow,
            logger=proto.logger, access_logger=proto.access_logger, access_log=proto.access_log,
            default_headers=proto.server_state.default_headers, message_event=given,
            expect_100_continue=False, keep_alive=self.keep_alive,
            on_response=proto.on_response_complete)
        cycle.body, cycle.more_body = bytearray(body), False
        cycle.disconnected = self.disconnected
        # The protocol tells the cycle in flight of a disconnect or a shutdown; a pipelined
        # request may already be the current cycle, then it stays so.
        if proto.cycle is cast(Any, self):
            proto.cycle = cycle
        self.response_complete = True
        await cycle.run_asgi(cast(ASGI3Application, self.hot.app))


class HotHttpProtocol(HttpToolsProtocol):
    """Set `body_limit` on a subclass (`hot_protocol`): a larger declared body is left to
    uvicorn, where the app refuses it without this protocol buffering it first."""

    body_limit = 0
    _defaults: list[tuple[bytes, bytes]] | None = None
    _default_lines = b""

    def default_lines(self) -> bytes:
        """uvicorn's default headers (date, server) as header lines; uvicorn replaces the list
        when the date changes, once a second."""
        defaults = self.server_state.default_headers
        if defaults is not self._defaults:
            self._defaults = defaults
            self._default_lines = b"".join(name + b": " + value + b"\r\n"
                                           for name, value in defaults)
        return self._default_lines

    def on_headers_complete(self) -> None:
        exchange = self._exchange()
        if exchange is None:
            super().on_headers_complete()
            return
        self.cycle = exchange  # type: ignore[assignment]

    def _exchange(self) -> _Exchange | None:
        """The hot exchange for the request whose headers were just read, or None."""
        hot, parser = self.app, self.parser
        if self.url.split(b"?", 1)[0] not in _HOT_URLS or parser.get_method() != b"POST":
            return None
        if not isinstance(hot, HotPath) or self.access_log or self.root_path:
            return None
        if self.expect_100_continue or parser.should_upgrade():
            return None
        if self.cycle is not None and not self.cycle.response_complete:
            return None  # pipelined behind a request in flight: uvicorn queues it
        admitted = hot.admit(self.headers)
        # No Content-Length (chunked) or a larger one: uvicorn reads what there is.
        if admitted is None or not 0 <= admitted[1].content_length <= self.body_limit:
            return None
        version = parser.get_http_version()
        keep_alive = version != "1.0" and parser.should_keep_alive()
        return _Exchange(self, hot, admitted, self._fill_scope(version), keep_alive)

    def _fill_scope(self, version: str) -> dict[str, Any]:
        """What uvicorn's `on_headers_complete` adds to the scope (root_path is empty here)."""
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]
        scope["method"] = "POST"
        scope["http_version"] = version
        parsed = httptools.parse_url(self.url)
        scope["path"] = parsed.path.decode("ascii")
        scope["raw_path"] = parsed.path
        scope["query_string"] = parsed.query or b""
        return scope

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
