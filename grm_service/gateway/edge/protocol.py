"""uvicorn's httptools protocol with the edge's limits (`EdgeProtocol`), and with one change
for the hot routes (`HotHttpProtocol`): their request/response exchange skips ASGI and uvicorn's
per-request cycle, and the answer leaves in ONE write.

Why: uvicorn writes a response's head and body in two `send` calls, and an ASGI exchange builds
message dicts, receive/send coroutines and a cycle object per request; on the gateway's hot path
that was a large share of the CPU per request (benchmarks/RESULTS.md, issue 14). Here the
protocol hands the body to `HotPath.serve` and writes the reply it returns. The rest of a large
body (an image) is read by the transport straight into one buffer (`body_reads.BodyReader`),
not copied three times on its way through uvloop, the parser and a join.

Taken this way only: `POST` to a hot route, HTTP/1.x, a Content-Length within the body limit,
no `Expect: 100-continue`, no earlier request of the connection still in flight, an app that is
the `HotPath` itself (no uvicorn middleware around it, as with proxy headers) and no access log.
Anything else goes through uvicorn unchanged, to the same `HotPath.serve` through its ASGI
adapter. `serve` answers every request it is given, refusals included: nothing goes back from
the exchange into uvicorn's cycle. Pipelined requests behind a hot one wait in uvicorn's own
pipeline queue (the exchange stands in as the in-flight cycle).

Both classes lean on uvicorn's private protocol: `protocol_check.py` checks what they use at
start-up and falls back (pyproject bounds uvicorn's version).
"""

from __future__ import annotations

import asyncio
import logging
import math

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from grm_service.errors import BadHeader, EdgeFull, RequestTimeout
from grm_service.gateway.edge.body_reads import BodyReader, Linger, body_buffer
from grm_service.gateway.edge.head import RequestHead
from grm_service.gateway.edge.hotpath import CHAT, CLASSIFY, HEAD, HotPath
from grm_service.gateway.edge.limits import EdgeLimits
from grm_service.gateway.edge.replies import Reply, error_reply, header_lines, wire

log = logging.getLogger(__name__)

_CHAT_URL = CHAT.encode()
_HOT_URLS = frozenset({_CHAT_URL, CLASSIFY.encode()})
_FAILED: Reply = (500, [(b"content-length", b"21")], b"Internal Server Error")
# Phases of the request a connection is in; the deadline of each is in limits.py.
_IDLE, _HEADERS, _BODY, _BUSY, _DRAIN, _LINGER = range(6)
# A hot body with at least this much still to come after the read that ended its headers is
# read by the transport straight into one buffer (`body_reads.BodyReader`); a smaller rest goes
# through the parser, whose copies of it cost less than switching the connection's protocol.
DIRECT_READ_BYTES = 16 << 10


class EdgeProtocol(HttpToolsProtocol):
    """The limits of `EdgeLimits` on every connection, and the two refusals the parser must
    make before any app runs: an upgrade (the gateway serves no WebSocket, and the parser
    stops at the headers of an upgrade request, so its body could never be read) and a body
    over the in-flight budget. Set `limits` on a subclass (`protocol_check.protocol_for`)."""

    limits: EdgeLimits
    deadline = math.inf
    _phase = _IDLE
    _refused = False
    _chunked = False
    _defaults: list[tuple[bytes, bytes]] | None = None
    _default_lines = b""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.ws_protocol_class = None  # an upgrade is refused here, never handed to websockets
        self._reserved: list[int] = []  # per request read and not yet answered, its bytes
        if not self.limits.opened(self):
            self._refuse_busy("connections", "too many open connections, the limit "
                              f"(GRM_MAX_CONNECTIONS={self.limits.max_connections}) of this "
                              "gateway process: retry later; raise GRM_MAX_CONNECTIONS or "
                              "reuse connections (keep-alive)")

    def connection_lost(self, exc: Exception | None) -> None:
        self.limits.closed(self)
        for size in self._reserved:
            self.limits.give(size)
        self._reserved.clear()
        super().connection_lost(exc)

    def expire(self) -> None:
        """Past the deadline of the phase: a 408 while a request is being read, else a close
        (a lingering one's too)."""
        if self._phase in (_HEADERS, _BODY):
            self._refuse(error_reply(RequestTimeout(
                "the request did not arrive in time (headers: "
                f"{self.limits.header_s:g} s, body: {self.limits.body_s:g} s)")))
        elif not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, answer: Reply, linger: int | None = None) -> None:
        """Answer and close. `linger`: the body may still be on its way, and the close lingers
        (limits.py says why) until this many more bytes came in, nothing came for `linger_s`,
        or `body_timeout_s` passed."""
        self._refused = True
        transport = self.transport
        if transport.is_closing():
            return
        transport.write(wire(answer, self.default_lines(), keep_alive=False))
        if linger is None or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()  # the client reads the answer, then the end
        limits = self.limits
        self._phase = _LINGER
        # From the next read on (the parser may still be handed the rest of this one).
        transport.set_protocol(Linger(self, linger, limits.now + limits.body_s))
        self.flow.resume_reading()

    def _refuse_busy(self, reason: str, message: str, linger: int | None = None) -> None:
        """A 503 with Retry-After for want of room, counted and logged (`Refusals`)."""
        self.limits.refusals.note(reason, 503, message)
        self._refuse(error_reply(EdgeFull(message, retry_after=1)), linger)

    def default_lines(self) -> bytes:
        """uvicorn's default headers (date, server) as header lines; uvicorn replaces the list
        when the date changes, once a second."""
        defaults = self.server_state.default_headers
        if defaults is not self._defaults:
            self._defaults = defaults
            self._default_lines = header_lines(defaults)
        return self._default_lines

    def _enter(self, phase: int, timeout_s: float) -> None:
        # The sweep's clock (`limits.now`), not a clock read per request: a deadline is late by
        # at most one tick.
        self._phase = phase
        self.deadline = self.limits.now + timeout_s

    def _unsupported_upgrade_warning(self) -> None:
        pass  # refused in on_headers_complete, with the reason in the answer

    def on_message_begin(self) -> None:
        if self._refused:
            return
        # uvicorn's resets without its scope: `start` has uvicorn build one for a request its
        # cycle runs, and a hot exchange reads none (the dict and the app state's copy cost
        # ~0.6 us a request).
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        limits = self.limits
        self._phase, self.deadline = _HEADERS, limits.now + limits.header_s

    def on_header(self, name: bytes, value: bytes) -> None:
        # uvicorn's without its look for `Expect: 100-continue`: `RequestHead` finds it.
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        head = RequestHead(self.headers)
        limits = self.limits
        size = head.content_length if head.content_length > 0 else 0
        if self.parser.should_upgrade():
            self._refuse(error_reply(BadHeader("Upgrade is not supported here: send the "
                                               "request without 'Upgrade' and 'Connection: "
                                               "upgrade'")), self._body_left(head))
        elif size > limits.budget - limits.in_flight:
            self._refuse_busy("bytes_in_flight", f"{limits.in_flight} request bytes in flight "
                              f"and this body's {size} would pass GRM_MAX_BYTES_IN_FLIGHT="
                              f"{limits.budget}: retry later; raise GRM_MAX_BYTES_IN_FLIGHT or "
                              "send smaller bodies", self._body_left(head))
        else:
            limits.in_flight += size  # `limits.take`, inlined: the room is checked above
            limits.moved += size
            self._reserved.append(size)
            self._chunked = head.content_length < 0
            self._phase, self.deadline = _BODY, limits.now + limits.body_s
            self.expect_100_continue = head.expect_continue
            self.start(head)

    def _body_left(self, head: RequestHead) -> int:
        """What a refused request may still send: its declared body, else (chunked) as much as
        the largest body taken."""
        return head.content_length if head.content_length >= 0 else self.limits.linger_bytes

    def start(self, head: RequestHead) -> None:
        """Run the request whose headers were just read, in uvicorn's cycle: uvicorn's
        per-request state is made now, as its `on_message_begin` makes it, keeping what the
        parser has read since."""
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        super().on_message_begin()
        self.url, self.headers, self.expect_100_continue = url, headers, expect
        self.scope["headers"] = headers
        self.scope[HEAD] = head  # type: ignore[literal-required]
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        if self._chunked:
            self._chunk(len(body))
        super().on_body(body)

    def _chunk(self, size: int) -> None:
        """A chunked body gives no length up front: its bytes count as they come."""
        if not self.limits.take(size):
            self._refuse_busy("bytes_in_flight", "the request bytes in flight reached "
                              f"GRM_MAX_BYTES_IN_FLIGHT={self.limits.budget}: retry later; "
                              "raise GRM_MAX_BYTES_IN_FLIGHT or send smaller bodies",
                              self.limits.linger_bytes)
            return
        self._reserved[-1] += size

    def on_message_complete(self) -> None:
        if self._refused:
            return
        if self._phase == _BODY:
            self._phase, self.deadline = _BUSY, math.inf
        elif self._phase == _DRAIN:
            self._enter(_IDLE, self.limits.idle_s)
        super().on_message_complete()

    def on_response_complete(self) -> None:
        """uvicorn's, with the idle timeout kept as this connection's deadline instead of a
        timer armed per response (and cancelled by the next request's first bytes)."""
        self.server_state.total_requests += 1
        limits, reserved = self.limits, self._reserved
        if reserved:
            limits.in_flight -= reserved.pop(0)  # `limits.give`, inlined
            if (limits.in_flight == 0 and limits.moved > limits.trim_after
                    and not limits.trim_pending):
                limits.quiet()
        if self._phase == _BUSY and not reserved:
            self._phase, self.deadline = _IDLE, limits.now + limits.idle_s
        elif self._phase == _BODY:
            self._phase = _DRAIN  # answered before its body ended (a refusal): no 408 after it
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)


class _Exchange:
    """One hot request on a connection. Stands in for uvicorn's cycle while in flight, so it has
    the attributes the protocol reads from one (`response_complete`, `keep_alive`,
    `disconnected`, `message_event`)."""

    def __init__(self, proto: HotHttpProtocol, hot: HotPath, head: RequestHead, path: str,
                 keep_alive: bool) -> None:
        self.proto = proto
        self.hot = hot
        self.head = head
        self.path = path
        self.keep_alive = keep_alive
        self.chunks: list[bytes | bytearray] = []
        self.left = head.content_length  # body bytes still to come
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
        self.chunks = []  # the body is held once, by `body`, while the request runs
        try:
            self._write(await self.hot.serve(self.path, self.head, body))
        except Exception:
            log.exception("exception in the hot path")
            if not self.response_complete:
                self.keep_alive = False
                self._write(_FAILED)

    def _write(self, reply: Reply) -> None:
        """Status line, headers and body in one write, then what uvicorn does after a response:
        close, or arm keep-alive and start the next pipelined request."""
        proto = self.proto
        data = wire(reply, proto.default_lines(), self.keep_alive)
        self.response_complete = True
        if self.disconnected or proto.transport.is_closing():
            return
        proto.transport.write(data)
        if self.keep_alive:
            proto.on_response_complete()
        else:
            proto.transport.close()


class HotHttpProtocol(EdgeProtocol):
    """Set `body_limit` on a subclass (`protocol_for`): a larger declared body is left to
    uvicorn, where the app refuses it without this protocol buffering it first."""

    body_limit = 0
    _runner: asyncio.Task[None] | None = None  # this connection's task for hot requests
    _next: asyncio.Future[_Exchange] | None = None  # set: the runner waits for a request

    def start(self, head: RequestHead) -> None:
        exchange = self._exchange(head)
        if exchange is None:
            super().start(head)
            return
        self.cycle = exchange  # type: ignore[assignment]

    def _exchange(self, head: RequestHead) -> _Exchange | None:
        """The hot exchange for the request whose headers were just read, or None."""
        hot, parser = self.app, self.parser
        if self.url.split(b"?", 1)[0] not in _HOT_URLS or parser.get_method() != b"POST":
            return None
        if not isinstance(hot, HotPath) or self.access_log or self.root_path:
            return None
        if self.expect_100_continue:
            return None
        if self.cycle is not None and not self.cycle.response_complete:
            return None  # pipelined behind a request in flight: uvicorn queues it
        # No Content-Length (chunked) or a larger one: uvicorn reads what there is.
        if not 0 <= head.content_length <= self.body_limit:
            return None
        version = parser.get_http_version()
        keep_alive = version != "1.0" and parser.should_keep_alive()
        path = CHAT if self.url.split(b"?", 1)[0] == _CHAT_URL else CLASSIFY
        return _Exchange(self, hot, head, path, keep_alive)

    def on_body(self, body: bytes) -> None:
        exchange = self.cycle
        if isinstance(exchange, _Exchange) and not self._refused:
            exchange.chunks.append(body)
            exchange.left -= len(body)
            if exchange.left >= DIRECT_READ_BYTES:
                self._read_rest(exchange)
            return
        super().on_body(body)

    def _read_rest(self, exchange: _Exchange) -> None:
        """The rest of a large hot body, read by the transport into the body's own buffer: the
        parser's path copies every read twice more (uvloop's read buffer into a bytes object,
        `on_body`'s copy of it) and the exchange joins them (a third). The parser has just
        handed on the last bytes of this read, so nothing of it is left behind."""
        transport = self.transport
        if transport.is_closing():
            return  # nothing more will be read
        buffer = body_buffer(exchange.head.content_length, exchange.chunks[0])
        filled = 0
        for chunk in exchange.chunks:
            buffer[filled:filled + len(chunk)] = chunk
            filled += len(chunk)
        exchange.chunks = [buffer]
        # Both loops give the reads to the protocol set from the next one on (uvloop
        # rebinds its read callbacks): `test_protocol.py` checks it on a real socket.
        transport.set_protocol(BodyReader(self, exchange, buffer, filled))

    def body_read(self, exchange: _Exchange) -> None:
        """The body is whole (`body_reads.BodyReader`): the connection is this protocol's again,
        read by a fresh parser (the one before still waits for the body), as uvicorn makes it."""
        exchange.left = 0
        self.parser = httptools.HttpRequestParser(self)
        self.transport.set_protocol(self)
        self.on_message_complete()

    def on_message_complete(self) -> None:
        exchange = self.cycle
        if not isinstance(exchange, _Exchange) or self._refused:
            super().on_message_complete()
            return
        self._phase, self.deadline = _BUSY, math.inf
        # A hot exchange starts only where none is in flight (`_exchange`): the runner, if
        # any, waits for this one.
        runner, waiting = self._runner, self._next
        if runner is None or waiting is None:
            runner = self._runner = self.loop.create_task(self._run(exchange))
        else:
            self._next = None
            waiting.set_result(exchange)
        self.tasks.add(runner)  # uvicorn's shutdown waits for it while a request runs

    async def _run(self, exchange: _Exchange) -> None:
        """This connection's hot requests, one after another: one task per connection rather
        than one per request (a task's start, registration and end: ~1.8 us in uvloop, measured).
        Between requests it waits for the next (`_next`), out of uvicorn's `tasks`."""
        runner = self._runner
        try:
            while True:
                await exchange.run()
                self.tasks.discard(runner)
                if self.transport.is_closing():  # closed, or lost (uvicorn closes it then)
                    return
                waiting = self._next = self.loop.create_future()
                exchange = await waiting
        finally:
            self._runner = self._next = None
            self.tasks.discard(runner)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._next is not None and self._runner is not None:
            self._runner.cancel()  # waiting for a request that will not come
        super().connection_lost(exc)
