"""The hot HTTP protocol on a mock asyncio transport: raw request bytes in through
`data_received`, the bytes written to the transport read back.

The `HotPath` in front is real, its admission too (key, repeated headers, size), with `serve`
answering a canned reply past admission so each test sets what the hot exchange gets; the app
behind it echoes what reached it, so a request that went to FastAPI shows up there, body
included (no hot request does: `serve` answers them all).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
from typing import Any, cast

import pytest
import uvicorn
import uvloop
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from grm_service.config import Settings
from grm_service.gateway.edge.body_reads import body_buffer
from grm_service.gateway.edge.head import Asker, RequestHead
from grm_service.gateway.edge.hotpath import CHAT, CLASSIFY, HotPath, Reply
from grm_service.gateway.edge.protocol import EdgeProtocol, HotHttpProtocol
from grm_service.gateway.edge.protocol_check import missing, protocol_for
from grm_service.gateway.request.context import ForwardContext
from grm_service.gateway.request.upstream import Upstream
from grm_service.gateway.service import Service
from grm_service.replicas.identity import ServiceIdentity
from grm_service.replicas.pool import ReplicaPool
from grm_service.testing.reads import hand_on

LIMIT = 65600  # the smallest body limit the settings allow, and a little
DEFAULTS = [(b"date", b"Thu, 01 Jan 2026 00:00:00 GMT"), (b"server", b"uvicorn")]
OK: Reply = (200, [(b"content-length", b"11"), (b"content-type", b"application/json")],
             b'{"ok":true}')
HEAD_OF_OK = (b"HTTP/1.1 200 OK\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
              b"content-length: 11\r\ncontent-type: application/json\r\n")


class Wire:
    """The asyncio transport side of one connection: what the protocol writes, and whether it
    closed the connection."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.eof = False  # the write side shut (a lingering close)
        self.protocol: asyncio.BaseProtocol | None = None

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default)

    def write(self, data: bytes) -> None:
        assert not self.closed and not self.eof, "written after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    @property
    def data(self) -> bytes:
        return b"".join(self.writes)


class Canned(HotPath):
    """The real admission; past it `serve` records the body and answers `reply`."""

    def __init__(self, app: Any, settings: Settings) -> None:
        service = Service(settings)
        service.start(ForwardContext(settings=settings, pool=ReplicaPool([]), client=Upstream(1.0),
                              metrics=service.metrics, identity=ServiceIdentity(settings)))
        super().__init__(app, service)
        self.reply: Reply | Exception = OK
        self.served: list[tuple[str, bytes]] = []
        self.hold: asyncio.Event | None = None

    async def serve(self, path: str, head: RequestHead, raw: bytes | bytearray) -> Reply:
        verdict = self.admission.admit(head, path)
        if not isinstance(verdict, Asker):
            return verdict
        self.served.append((path, raw))
        if self.hold is not None:
            await self.hold.wait()
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply


class Echo:
    """The app behind the hot path: answers what reached it as JSON."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.seen.append((scope["method"], scope["path"], body))
        payload = json.dumps({"path": scope["path"], "body": body.decode()}).encode()
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})


class Connection:
    def __init__(self, hot: Canned, echo: Echo, access_log: bool = False,
                 protocol: type[Any] | None = None) -> None:
        self.hot, self.echo, self.wire = hot, echo, Wire()
        self.state = ServerState()
        self.state.default_headers = list(DEFAULTS)
        # As run_server builds it: no proxy-headers middleware around the app, no logging setup.
        config = uvicorn.Config(hot, proxy_headers=False, log_config=None, lifespan="off",
                                ws="none")
        protocol = protocol or protocol_for(hot.service)
        self.proto = protocol(config, self.state, {}, asyncio.get_running_loop())
        # uvicorn derives this from the access logger's handlers (pytest's capture adds some):
        # set as `serve` runs it, without an access log.
        self.proto.access_log = access_log
        self.wire.protocol = self.proto
        self.proto.connection_made(self.wire)  # type: ignore[arg-type]

    async def send(self, *parts: bytes) -> bytes:
        """Feed the parts, wait for every task they started, return what was written."""
        before = len(self.wire.writes)
        for part in parts:
            hand_on(self.wire, part)
        await self.settled()
        return b"".join(self.wire.writes[before:])

    async def settled(self) -> None:
        """Until no request runs: uvicorn's `tasks` holds a task while it runs one (a hot
        connection's task stays, waiting for its next request, out of the set)."""
        for _ in range(1000):
            if not self.state.tasks:
                return
            await asyncio.sleep(0)
        raise AssertionError("requests keep running")

    def close(self) -> None:
        if not self.wire.closed:
            self.proto.connection_lost(None)


@pytest.fixture
async def conn() -> Any:
    settings = Settings(model="m", served_model_name="rm", max_body_bytes=LIMIT,
                        max_image_bytes=1)
    echo = Echo()
    connection = Connection(Canned(echo, settings), echo)
    yield connection
    connection.close()


def post(path: str, body: bytes, *headers: str, version: str = "1.1",
         content_type: str = "application/json") -> bytes:
    lines = [f"POST {path} HTTP/{version}", "host: gw", f"content-type: {content_type}",
             f"content-length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def test_a_hot_request_is_answered_in_one_write_and_the_connection_kept(
    conn: Connection,
) -> None:
    request = post(CHAT, b'{"messages": [1]}')
    written = await conn.send(request[:30], request[30:-5], request[-5:])
    assert conn.wire.writes == [HEAD_OF_OK + b"\r\n" + b'{"ok":true}']
    assert written == conn.wire.writes[0]
    assert conn.hot.served == [(CHAT, b'{"messages": [1]}')]
    assert conn.echo.seen == [] and not conn.wire.closed
    assert conn.state.total_requests == 1
    again = await conn.send(post(CLASSIFY, b"{}"))
    assert again == HEAD_OF_OK + b"\r\n" + b'{"ok":true}'
    assert conn.hot.served[-1] == (CLASSIFY, b"{}")


@pytest.mark.parametrize(("version", "header"), [("1.0", None), ("1.1", "connection: close")])
async def test_a_client_that_asks_for_close_gets_it(conn: Connection, version: str,
                                                    header: str | None) -> None:
    written = await conn.send(post(CHAT, b"{}", *([header] if header else []), version=version))
    assert written == HEAD_OF_OK + b"connection: close\r\n\r\n" + b'{"ok":true}'
    assert conn.wire.closed


@pytest.mark.parametrize("failure", [
    RuntimeError("boom"),
    None,  # a reply whose header value holds a CRLF: refused rather than split
])
async def test_a_failing_exchange_is_a_500_and_a_closed_connection(
    conn: Connection, failure: Exception | None, caplog: pytest.LogCaptureFixture,
) -> None:
    conn.hot.reply = failure or (200, [(b"x-a", b"1\r\nset-cookie: evil")], b"{}")
    written = await conn.send(post(CHAT, b"{}"))
    assert written == (b"HTTP/1.1 500 Internal Server Error\r\ndate: Thu, 01 Jan 2026 00:00:00 "
                       b"GMT\r\nserver: uvicorn\r\ncontent-length: 21\r\nconnection: close\r\n"
                       b"\r\nInternal Server Error")
    assert b"evil" not in written and conn.wire.closed
    assert "exception in the hot path" in caplog.text


@pytest.mark.parametrize("request_bytes", [
    b"GET /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n\r\n",
    post("/v1/score", b"{}"),
], ids=["get", "score"])
async def test_requests_for_the_app_reach_it_through_uvicorn(
    conn: Connection, request_bytes: bytes
) -> None:
    written = await conn.send(request_bytes)
    assert conn.hot.served == []
    ((method, path, body),) = conn.echo.seen
    assert request_bytes.startswith(f"{method} {path} ".encode()) and request_bytes.endswith(body)
    assert written.startswith(b"HTTP/1.1 201 Created\r\n")


@pytest.mark.parametrize(("request_bytes", "body"), [
    (post(CHAT, b"{}", "expect: 100-continue"), b"{}"),
    (b"POST /classify HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
     b"transfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", b"{}"),
])
async def test_hot_requests_the_exchange_leaves_are_served_through_asgi(
    conn: Connection, request_bytes: bytes, body: bytes
) -> None:
    written = await conn.send(request_bytes)
    assert [raw for _, raw in conn.hot.served] == [body]
    # uvicorn's cycle writes the head, then the body: not the exchange's one write.
    *_, head, tail = conn.wire.writes
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and tail == b'{"ok":true}'
    if b"expect" in request_bytes:
        assert written.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert conn.echo.seen == []


async def test_hot_requests_never_reach_the_app(conn: Connection) -> None:
    """Not JSON: the exchange reads it and `serve` answers (here, its canned reply). Declared
    over the body limit: uvicorn's cycle, where the door refuses it from its head, unread."""
    plain = await conn.send(post(CHAT, b"{}", content_type="text/plain"))
    assert plain == HEAD_OF_OK + b"\r\n" + b'{"ok":true}'
    assert conn.hot.served == [(CHAT, b"{}")]
    large = await conn.send(post(CHAT, b"[" * (LIMIT + 1)))
    assert large.startswith(b"HTTP/1.1 413 ") and b"the limit is" in large
    assert conn.echo.seen == [] and len(conn.hot.served) == 1


async def test_with_an_access_log_the_exchange_steps_aside() -> None:
    settings = Settings(model="m")
    echo = Echo()
    connection = Connection(Canned(echo, settings), echo, access_log=True)
    try:
        written = await connection.send(post(CHAT, b"{}"))
    finally:
        connection.close()
    # HotPath still serves it, through ASGI (two writes: head, then body).
    assert connection.hot.served == [(CHAT, b"{}")] and len(connection.wire.writes) == 2
    assert written.startswith(b"HTTP/1.1 200 OK\r\n") and written.endswith(b'{"ok":true}')


async def test_pipelined_requests_are_answered_in_order(conn: Connection) -> None:
    written = await conn.send(post(CHAT, b'{"n": 1}') + post(CHAT, b'{"n": 2}'))
    assert conn.hot.served == [(CHAT, b'{"n": 1}'), (CHAT, b'{"n": 2}')]
    assert written.count(b"HTTP/1.1 200 OK\r\n") == 2 and written.endswith(b'{"ok":true}')
    assert conn.wire.writes[0] == HEAD_OF_OK + b"\r\n" + b'{"ok":true}'
    assert conn.state.total_requests == 2


async def test_a_body_over_many_reads_then_the_next_request_in_its_last_read(
    conn: Connection,
) -> None:
    """Past the read that ends the headers, the transport reads a large hot body into one
    buffer, and no further; what follows it in the same read is the next request, read by the
    protocol's fresh parser."""
    body = b'{"messages": ["' + b"x" * 40_000 + b'"]}'
    first, second = post(CHAT, body), post(CLASSIFY, b'{"n": 2}')
    cut = len(first) - 1000
    reads = [first[:200], first[200:20_000], first[20_000:cut], first[cut:] + second[:25],
             second[25:]]
    written = await conn.send(*reads)
    assert conn.hot.served == [(CHAT, body), (CLASSIFY, b'{"n": 2}')]
    assert isinstance(conn.hot.served[0][1], bytearray)  # the buffer the transport read into
    assert conn.wire.protocol is conn.proto  # given back
    assert written.count(b"HTTP/1.1 200 OK\r\n") == 2 and not conn.wire.closed
    assert conn.state.total_requests == 2
    again = await conn.send(post(CHAT, body), post(CHAT, b"{}"))
    assert conn.hot.served[-2:] == [(CHAT, body), (CHAT, b"{}")]
    assert again.count(b"HTTP/1.1 200 OK\r\n") == 2 and conn.state.total_requests == 4


async def test_a_large_body_read_into_a_buffer_with_its_data_url_on_a_word_boundary(
    conn: Connection,
) -> None:
    """The buffer a large body is read into starts where the first data URL's text falls on a
    word boundary (CPython's ASCII decoder then copies it in one pass); the body is the same."""
    for lead in range(9):
        body = (b'{"pad": "' + b"p" * lead + b'", "url": "data:image/png;base64,' +
                b"QUJD" * 10_000 + b'"}')
        await conn.send(post(CHAT, body)[:300], post(CHAT, body)[300:])
        served = conn.hot.served[-1][1]
        assert served == body and isinstance(served, bytearray) and len(served) == len(body)
        text = body.find(b'"data:') + 1
        assert ctypes.addressof(ctypes.c_char.from_buffer(served, text)) % 8 == 0


def test_a_body_buffer_without_a_data_url_is_as_asked() -> None:
    for size in (1, 20_000, 3_000_000):
        assert len(body_buffer(size, b'{"messages": [')) == size
        assert len(body_buffer(size, b'{"url": "data:')) == size


def runners() -> list[asyncio.Task[Any]]:
    """The connections' tasks for hot requests still alive, the test's own left out."""
    return [task for task in asyncio.all_tasks()
            if task is not asyncio.current_task() and not task.done()]


async def test_a_client_gone_before_the_answer_gets_nothing_written(conn: Connection) -> None:
    conn.hot.hold = asyncio.Event()
    conn.proto.data_received(post(CHAT, b"{}"))
    await asyncio.sleep(0)
    assert conn.hot.served == [(CHAT, b"{}")]
    conn.proto.connection_lost(None)
    conn.hot.hold.set()
    await conn.settled()
    assert conn.wire.writes == []
    await asyncio.sleep(0)
    assert runners() == []  # the connection's task ended with its request


async def test_one_task_runs_a_connections_hot_requests_and_ends_with_it(
    conn: Connection,
) -> None:
    ran: list[asyncio.Task[Any] | None] = []
    serve = conn.hot.serve

    async def noting(path: str, head: RequestHead, raw: bytes | bytearray) -> Reply:
        ran.append(asyncio.current_task())
        return await serve(path, head, raw)

    conn.hot.serve = noting  # type: ignore[method-assign]
    for body in (b"{}", b"[1]", b"{}"):
        assert await conn.send(post(CHAT, body)) == HEAD_OF_OK + b"\r\n" + b'{"ok":true}'
        assert not conn.state.tasks  # between requests it waits outside uvicorn's tasks
    assert len(set(ran)) == 1 and len(ran) == 3
    assert runners() == [ran[0]]
    conn.proto.connection_lost(None)
    await asyncio.sleep(0)
    assert runners() == []


def test_protocol_for_sets_the_body_limit_on_a_subclass() -> None:
    cls = protocol_for(Service(Settings(model="m", max_body_bytes=30 << 20)))
    assert issubclass(cls, HotHttpProtocol) and cls.body_limit == 30 << 20
    assert HotHttpProtocol.body_limit == 0


# ---- the start-up check of uvicorn's internals, and the fallback ---------------------------

class Renamed(HttpToolsProtocol):
    """uvicorn with a per-request attribute renamed (as upstream has done between releases)."""

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.request_headers = self.headers
        del self.headers


class Unpiped(HttpToolsProtocol):
    """uvicorn with the in-flight cycle renamed: the exchange could not stand in for it."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        del self.cycle


def test_the_check_finds_everything_in_the_installed_uvicorn() -> None:
    assert missing() == ([], [])


def test_the_check_names_what_a_changed_uvicorn_lacks() -> None:
    assert missing(Renamed) == (["headers"], [])
    assert missing(Unpiped) == ([], ["cycle"])


@pytest.mark.parametrize(("check", "expected", "words"), [
    (([], ["cycle"]), EdgeProtocol, "go through ASGI"),
    ((["headers"], []), HttpToolsProtocol, "uvicorn's own protocol"),
])
async def test_a_failed_check_falls_back_with_one_log_line_and_serves(
    check: tuple[list[str], list[str]], expected: type[Any], words: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(model="m")
    echo = Echo()
    hot = Canned(echo, settings)
    with caplog.at_level(logging.INFO, logger="grm_service"):
        protocol = protocol_for(hot.service, check)
    (line,) = [r for r in caplog.records if r.name.startswith("grm_service")]
    assert line.levelno == logging.WARNING and words in line.getMessage()
    assert issubclass(protocol, expected) and not issubclass(protocol, HotHttpProtocol)
    connection = Connection(hot, echo, protocol=protocol)
    try:
        written = await connection.send(post(CHAT, b'{"messages": [1]}'))
    finally:
        connection.close()
    # The hot path serves it through ASGI: uvicorn's cycle writes the head, then the body.
    assert hot.served == [(CHAT, b'{"messages": [1]}')] and len(connection.wire.writes) == 2
    assert written.startswith(b"HTTP/1.1 200 OK\r\n") and written.endswith(b'{"ok":true}')


# ---- the edge's limits on one connection ----------------------------------------------------

def limited(**over: Any) -> Canned:
    settings = Settings(model="m", max_body_bytes=LIMIT, max_image_bytes=1, **over)
    return Canned(Echo(), settings)


@pytest.mark.parametrize(("over", "sent"), [
    ({"header_timeout_s": 0.2}, b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncont"),
    ({"body_timeout_s": 0.2}, post(CHAT, b"x" * 50_000)[:30_000]),
], ids=["half a header", "a large body, read midway"])
async def test_a_request_too_slow_is_answered_408_and_closed(over: dict[str, float],
                                                              sent: bytes) -> None:
    hot = limited(**over)
    connection = Connection(hot, hot.app)
    await connection.send(sent)
    for _ in range(100):
        if connection.wire.closed:
            break
        await asyncio.sleep(0.02)
    assert connection.wire.closed and connection.wire.data.startswith(b"HTTP/1.1 408 ")
    assert hot.served == []
    connection.close()


async def test_a_body_over_the_byte_budget_is_refused_before_it_is_read() -> None:
    hot = limited(max_bytes_in_flight=LIMIT + 100)
    hot.hold = asyncio.Event()
    first, second = Connection(hot, hot.app), Connection(hot, hot.app)
    try:
        first.proto.data_received(post(CHAT, b"x" * LIMIT))  # held in `serve`
        await asyncio.sleep(0)
        assert hot.service.limits.in_flight == LIMIT
        head = post(CHAT, b"").replace(b"content-length: 0", b"content-length: 101")
        written = await second.send(head)  # headers only: no byte of the body sent
        assert written.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in written
        # A lingering close: the write side shut, the body the client still sends read and
        # dropped, unparsed, and the connection closed at a byte past it.
        assert second.wire.eof and not second.wire.closed
        await second.send(b"{" * 60, b"\r\n\r\n" * 10, b"x")
        assert second.wire.data == written and not second.wire.closed
        hand_on(second.wire, b" ")
        assert second.wire.closed and len(hot.served) == 1
        hot.hold.set()
        await first.settled()
        assert hot.service.limits.in_flight == 0
    finally:
        first.close()
        second.close()


async def test_a_client_gone_midway_through_a_large_body_frees_its_bytes() -> None:
    """The connection lost while the transport reads a body into its buffer: the loss reaches
    the protocol (the reader hands it on), no request runs, the body's bytes are given back."""
    hot = limited()
    connection = Connection(hot, hot.app)
    request = post(CHAT, b"x" * 50_000)
    await connection.send(request[:1000], request[1000:30_000])
    assert isinstance(connection.wire.protocol, asyncio.BufferedProtocol)
    assert hot.service.limits.in_flight == 50_000
    connection.wire.protocol.connection_lost(None)
    await connection.settled()
    assert hot.served == [] and hot.service.limits.in_flight == 0


class _Split(asyncio.Protocol):
    """Reads 10 head bytes, hands the connection to a buffered reader for `size` bytes, then
    takes it back and keeps what follows."""

    def __init__(self, size: int, done: asyncio.Future[tuple[bytes, bytes]]) -> None:
        self.size, self.done, self.after = size, done, b""
        self.reader: _Reader | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.reader is None:
            self.reader = _Reader(self, bytearray(self.size))
            self.transport.set_protocol(self.reader)
            assert data == b"h" * 10, "the head arrives alone: the sender waits between parts"
            return
        self.after += data
        if self.after.endswith(b"END"):
            self.done.set_result((bytes(self.reader.buffer), self.after))
            self.transport.close()


class _Reader(asyncio.BufferedProtocol):
    def __init__(self, owner: _Split, buffer: bytearray) -> None:
        self.owner, self.buffer, self.filled = owner, buffer, 0

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.buffer)[self.filled:]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.filled == len(self.buffer):
            self.owner.transport.set_protocol(self.owner)


@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop],
                         ids=["asyncio", "uvloop"])
def test_a_connection_switched_to_a_buffered_reader_and_back_on_a_real_socket(
    new_loop: Any,
) -> None:
    """What `BodyReader` relies on: each loop gives a protocol set mid-connection the next
    reads, a buffered one no further than the buffer it gave, and the bytes after it to the
    protocol set back."""
    size = 3 << 20
    body = bytes(range(256)) * (size // 256)

    async def run() -> tuple[bytes, bytes]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[bytes, bytes]] = loop.create_future()
        server = await loop.create_server(lambda: _Split(size, done), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"h" * 10)
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(body + b"next request END")
        try:
            return await asyncio.wait_for(done, 30)
        finally:
            writer.close()
            await writer.wait_closed()
            server.close()
            await server.wait_closed()

    loop = new_loop()
    try:
        read, after = loop.run_until_complete(run())
    finally:
        loop.close()
    assert read == body and after == b"next request END"


async def one_request(hot: Canned, raw: bytes) -> tuple[bytes, Connection]:
    """`raw` on a connection of its own, closed after; what was written, and the connection."""
    connection = Connection(hot, hot.app)
    try:
        return await connection.send(raw), connection
    finally:
        connection.close()


async def test_an_upgrade_request_is_refused_400_and_closed() -> None:
    hot = limited()
    written, connection = await one_request(
        hot, post(CHAT, b"{}", "connection: upgrade", "upgrade: websocket"))
    assert written.startswith(b"HTTP/1.1 400 ") and b"Upgrade is not supported" in written
    assert connection.wire.closed and hot.served == []


async def test_a_connection_over_the_open_bound_is_refused_503() -> None:
    hot = limited(max_connections=1)
    first, second = Connection(hot, hot.app), Connection(hot, hot.app)
    try:
        assert second.wire.closed and second.wire.data.startswith(b"HTTP/1.1 503 ")
        assert b"too many open connections" in second.wire.data
        assert not first.wire.closed
        assert (await first.send(post(CHAT, b"{}"))).startswith(b"HTTP/1.1 200 ")
    finally:
        first.close()
        second.close()
    third = Connection(hot, hot.app)  # the first one's close gave its place back
    try:
        assert not third.wire.closed
    finally:
        third.close()


async def test_a_repeated_singleton_header_is_refused_by_the_door() -> None:
    hot = limited()
    written, _ = await one_request(
        hot, post(CHAT, b"{}", "authorization: Bearer a", "authorization: Bearer b"))
    assert written.startswith(b"HTTP/1.1 400 ") and b"sent more than once" in written
    assert hot.served == [] and hot.app.seen == []


async def until_closed(connection: Connection, feed: bool, within_s: float) -> float:
    """Seconds until the connection closed, fed a byte every 20 ms if `feed`."""
    start = asyncio.get_running_loop().time()
    while not connection.wire.closed:
        elapsed = asyncio.get_running_loop().time() - start
        assert elapsed < within_s, "still open"
        if feed:
            hand_on(connection.wire, b" ")
        await asyncio.sleep(0.02)
    return asyncio.get_running_loop().time() - start


@pytest.mark.parametrize("feed", [False, True], ids=["silent", "still sending"])
async def test_a_lingering_connection_is_closed_when_idle_or_at_the_body_deadline(
    feed: bool,
) -> None:
    """nginx's lingering_timeout (`linger_s` without a byte) and lingering_time (the body's
    deadline, however much still comes). The feed's 20 ms gaps against a `linger_s` of 0.5 s:
    only a stall of the test's process over ~0.35 s (a deadline is set from the clock of the
    last sweep, a tick behind) would close the feeding connection early; at 0.2 s, a suite
    loaded by engine starts did it once."""
    hot = limited(max_bytes_in_flight=LIMIT, linger_s=0.5, body_timeout_s=1.5)
    connection = Connection(hot, hot.app)
    try:
        head = post(CHAT, b"").replace(b"content-length: 0", b"content-length: 100000000")
        assert (await connection.send(head)).startswith(b"HTTP/1.1 503 ")
        assert connection.wire.eof and not connection.wire.closed
        took = await until_closed(connection, feed, within_s=4.0)
        assert (1.2 < took < 3.0) if feed else took < 1.2
    finally:
        connection.close()

