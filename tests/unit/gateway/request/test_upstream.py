"""The gateway's keep-alive pool against a real HTTP/1.1 server on 127.0.0.1 whose behaviour
each test sets: keep-alive, chunked answers, closes, silence, garbage."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from grm_service.errors import ResponseTooLarge
from grm_service.gateway.request.upstream import Upstream, UpstreamProtocolError

Reply = Callable[[bytes], bytes | None]  # request body -> raw response bytes (None: stay silent)


def ok(body: bytes, extra: str = "") -> bytes:
    return (f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{extra}"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def chunked(body: bytes) -> bytes:
    half = len(body) // 2
    parts = [body[:half], body[half:]]
    encoded = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts)
    return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + encoded + b"0\r\n\r\n"


@dataclass
class Server:
    reply: Reply
    close_after: bool = False  # close each connection once it answered
    idle_close_s: float | None = None  # close a connection idle this long (vLLM: 5 s)
    hold_s: float = 0.0  # time each answer takes
    second: bytes | None = None  # a connection's second request: these bytes, then a close
    connections: int = 0
    most_open: int = 0  # connections open at once, at most
    open_now: int = 0
    bodies: list[bytes] = field(default_factory=list)
    targets: list[bytes] = field(default_factory=list)  # request paths as received
    url: str = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            for count in range(1, 1 << 30):
                async with asyncio.timeout(self.idle_close_s):
                    head = await reader.readuntil(b"\r\n\r\n")
                self.targets.append(head.split(b" ")[1])
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                body = await reader.readexactly(length)
                self.bodies.append(body)
                await asyncio.sleep(self.hold_s)
                if count == 2 and self.second is not None:
                    writer.write(self.second)
                    await writer.drain()
                    return
                answer = self.reply(body)
                if answer is None:
                    await asyncio.sleep(3600)
                    return
                writer.write(answer)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        finally:
            self.open_now -= 1
            writer.close()


Serve = Callable[..., Awaitable[Server]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[asyncio.Server] = []

    async def started(reply: Reply, close_after: bool = False, **behaviour: Any) -> Server:
        state = Server(reply, close_after, **behaviour)
        server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
        servers.append(server)
        state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return state

    yield started
    for server in servers:
        server.close()


async def test_keep_alive_reuses_one_connection(serve: Serve) -> None:
    srv = await serve(lambda body: ok(b'{"echo":' + body + b"}"))
    pool = Upstream(5.0)
    for i in range(3):
        answer = await pool.post(srv.url, "/v1/x", b'{"i":%d}' % i)
        assert answer == (200, b'{"echo":{"i":%d}}' % i)
    assert srv.connections == 1
    await pool.close()


async def test_chunked_answer_and_concurrent_requests(serve: Serve) -> None:
    srv = await serve(lambda body: chunked(body * 3))
    pool = Upstream(5.0)
    answers = await asyncio.gather(*(pool.post(srv.url, "/p", b"%d" % i) for i in range(8)))
    assert answers == [(200, b"%d" % i * 3) for i in range(8)]
    assert srv.connections == 8, "one connection per concurrent request"
    await pool.post(srv.url, "/p", b"x")
    assert srv.connections == 8, "then they are reused"
    await pool.close()


async def test_replica_closing_idle_connections_is_not_an_error(
    serve: Serve,
) -> None:
    srv = await serve(lambda body: ok(body), close_after=True)
    pool = Upstream(5.0)
    for i in range(3):
        await asyncio.sleep(0.01)
        assert await pool.post(srv.url, "/p", b"%d" % i) == (200, b"%d" % i)
    assert srv.connections == 3


async def test_an_idle_connection_closed_as_it_is_reused_sends_again_on_a_fresh_one(
    serve: Serve,
) -> None:
    """The replica closed the kept connection as the request went out (its keep-alive timeout
    and the request crossed): nothing was answered, so the request goes again, on a new
    connection; once, since a fresh connection that fails is the replica's failure."""
    srv = await serve(lambda body: ok(body), second=b"")
    pool = Upstream(5.0)
    assert await pool.post(srv.url, "/p", b"a") == (200, b"a")
    assert await pool.post(srv.url, "/p", b"b") == (200, b"b")
    assert srv.bodies == [b"a", b"b", b"b"] and srv.connections == 2


async def test_a_reused_connection_that_answered_in_part_is_not_sent_again(
    serve: Serve,
) -> None:
    srv = await serve(lambda body: ok(body), second=b"HTTP/1.1 200 OK\r\ncontent-len")
    pool = Upstream(5.0)
    assert await pool.post(srv.url, "/p", b"a") == (200, b"a")
    with pytest.raises(ConnectionError):
        await pool.post(srv.url, "/p", b"b")
    assert srv.bodies == [b"a", b"b"] and srv.connections == 1


async def test_connections_the_replica_closed_while_idle_leave_the_pool(serve: Serve) -> None:
    # vLLM closes a connection idle for 5 s; a trainer's steps leave gaps longer than that.
    # Not much shorter here: the server's idle timer also runs while its first request is on the
    # way, and a loaded machine can stall this loop for tens of milliseconds.
    srv = await serve(lambda body: ok(body), idle_close_s=0.25, hold_s=0.01)
    pool = Upstream(5.0)
    for burst in range(6):
        answers = await asyncio.gather(*(pool.post(srv.url, "/p", b"%d" % i) for i in range(4)))
        assert answers == [(200, b"%d" % i) for i in range(4)]
        assert len(pool._open) <= 4, f"burst {burst}: {len(pool._open)} connections kept"
        await asyncio.sleep(0.75)  # the replica closes all four
    assert srv.connections == 24
    assert pool._open == set(), "every connection the replica closed is forgotten"
    assert pool._replicas == {}, "nothing is kept for a replica with no connection"
    await pool.close()


async def test_connections_per_replica_are_bounded(serve: Serve) -> None:
    srv = await serve(lambda body: ok(body), hold_s=0.05)
    pool = Upstream(5.0, max_connections=2)
    answers = await asyncio.gather(*(pool.post(srv.url, "/p", b"%d" % i) for i in range(6)))
    assert answers == [(200, b"%d" % i) for i in range(6)], "the others waited their turn"
    assert srv.most_open == 2
    assert srv.connections == 2
    await pool.close()


async def test_a_wait_for_a_connection_is_bounded_by_the_timeout(serve: Serve) -> None:
    srv = await serve(lambda body: ok(body), hold_s=1.0)
    pool = Upstream(0.3, max_connections=1)
    first = asyncio.create_task(pool.post(srv.url, "/p", b"1"))
    await asyncio.sleep(0.05)
    with pytest.raises(TimeoutError):
        await pool.post(srv.url, "/p", b"2")
    with pytest.raises(TimeoutError):
        await first
    await pool.close()


@pytest.mark.parametrize("answer", [ok, chunked])
async def test_an_answer_over_the_cap_is_refused_and_its_connection_dropped(
    serve: Serve, answer: Callable[[bytes], bytes]
) -> None:
    srv = await serve(lambda body: answer(b"x" * int(body)))
    pool = Upstream(5.0, max_response_bytes=4096)
    assert await pool.post(srv.url, "/p", b"4096") == (200, b"x" * 4096)
    with pytest.raises(ResponseTooLarge, match=r"over 4096 bytes.*GRM_MAX_RESPONSE_BYTES"):
        await pool.post(srv.url, "/p", b"1000000")
    await asyncio.sleep(0.05)
    assert pool._open == set(), "a half-read answer leaves its connection unusable: dropped"
    assert await pool.post(srv.url, "/p", b"10") == (200, b"x" * 10)
    await pool.close()


async def test_connection_close_header_is_honoured(serve: Serve) -> None:
    srv = await serve(lambda body: ok(body, "connection: close\r\n"))
    pool = Upstream(5.0)
    await pool.post(srv.url, "/p", b"1")
    await pool.post(srv.url, "/p", b"2")
    assert srv.connections == 2
    await pool.close()


async def test_silence_is_a_timeout_and_garbage_a_protocol_error(
    serve: Serve,
) -> None:
    silent = await serve(lambda body: None)
    with pytest.raises(TimeoutError):
        await Upstream(0.2).post(silent.url, "/p", b"{}")
    garbage = await serve(lambda body: b"SMTP ready\r\n\r\n")
    with pytest.raises(UpstreamProtocolError):
        await Upstream(5.0).post(garbage.url, "/p", b"{}")


async def test_refused_is_a_connection_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ConnectionError):
        await Upstream(5.0).post(f"http://127.0.0.1:{port}", "/p", b"{}")


async def test_large_body_arrives_whole(serve: Serve) -> None:
    srv = await serve(lambda body: ok(b'{"n":%d}' % len(body)))
    pool = Upstream(5.0)
    big = b'"' + b"a" * (3 << 20) + b'"'
    assert await pool.post(srv.url, "/p", big) == (200, b'{"n":%d}' % len(big))
    assert srv.bodies[-1] == big
    await pool.close()


async def test_replica_behind_a_path_prefix(serve: Serve) -> None:
    srv = await serve(lambda body: ok(b"{}"))
    pool = Upstream(5.0)
    await pool.post(srv.url + "/vllm/", "/v1/chat/completions", b"{}")
    await pool.post(srv.url, "/classify", b"{}")
    assert srv.targets == [b"/vllm/v1/chat/completions", b"/classify"]
    await pool.close()


@pytest.mark.parametrize("size", [10, 200_000])  # one coalesced write; head and parts written
async def test_a_body_in_parts_arrives_as_their_concatenation(serve: Serve, size: int) -> None:
    srv = await serve(lambda body: ok(b"%d" % len(body)))
    pool = Upstream(5.0)
    long = bytes(range(256)) * (size // 256 + 1)
    parts = (b'{"a":"', memoryview(long)[3:size], b'"}')
    assert await pool.post(srv.url, "/p", *parts) == (200, b"%d" % (size + 5))
    assert srv.bodies == [b"".join(parts)]
    await pool.close()


# A replica that vanished without closing its connections: the gateway's replica connections
# bound unacknowledged sends (TCP_USER_TIMEOUT). (The end-to-end case, a replica container cut
# off its network, runs in tests/compose/check_stack.py.)
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class _AnswerOnce:
    """A replica answering one request, then holding the connection until the client closes."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            writer.write(ANSWER)
            await writer.drain()
            await reader.read()
        finally:
            writer.close()
            await writer.wait_closed()
            self.closed.set()


@pytest.mark.skipif(sys.platform != "linux", reason="TCP_USER_TIMEOUT is Linux's")
@pytest.mark.parametrize(("ack_timeout_s", "expected_ms"), [(1.5, 1500), (None, 0)])
async def test_replica_connections_bound_unacknowledged_sends(
    ack_timeout_s: float | None, expected_ms: int
) -> None:
    replica = _AnswerOnce()
    server = await asyncio.start_server(replica, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    pool = Upstream(5.0, ack_timeout_s=ack_timeout_s)
    try:
        assert await pool.post(url, "/v1/chat/completions", b"{}") == (200, b"{}")
        (conn,) = pool._open
        assert conn.transport is not None
        sock = conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == expected_ms
    finally:
        await pool.close()
        await asyncio.wait_for(replica.closed.wait(), 5)
        server.close()
        await server.wait_closed()


def test_a_pool_used_on_another_loop_still_times_out() -> None:
    """The deadlines' timer is the loop's: a loop that ended with a request waiting leaves its
    timer behind, never to run, and the next loop arms its own."""
    with socket.socket() as silent:  # takes connections into its backlog, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        pool = Upstream(0.2)

        async def left_waiting() -> None:
            asyncio.get_running_loop().create_task(pool.post(url, "/p", b"{}"))
            await asyncio.sleep(0.05)  # sent; the loop ends with its answer awaited

        async def times_out() -> None:
            with pytest.raises(TimeoutError, match="no complete answer in time"):
                await asyncio.wait_for(pool.post(url, "/p", b"{}"), 5)
            await pool.close()

        asyncio.run(left_waiting())
        asyncio.run(times_out())
