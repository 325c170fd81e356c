"""Keep-alive HTTP/1.1 connections from the gateway to its replicas, on raw asyncio transports.

The gateway sends a replica one kind of request: a POST with a JSON body, answered by a JSON
body. A general client does much more per request (header objects, cookie jars, tracing hooks,
stream wrappers): aiohttp's client alone measured ~90 us of CPU per request on the benchmark,
more than the whole rest of the gateway's work. Here a request is one `write` of prebuilt bytes
and the answer is parsed by httptools (llhttp, the parser uvicorn serves with).

Errors are the standard ones, so the proxy maps them once: `TimeoutError` (no complete answer in
time), `ConnectionError` (refused, reset, closed early) and `UpstreamProtocolError` (not HTTP).

A replica that vanishes without closing its connections (its container killed or cut off, its
host gone) leaves idle connections half-open: a request written on one is never answered and
never fails until the request timeout (minutes). TCP_USER_TIMEOUT (`ack_timeout_s`) bounds how
long sent bytes may stay unacknowledged; a live replica's kernel acknowledges at once however
long its engine takes to answer, so slow generations are unaffected. Linux only.

Two bounds keep one replica from costing the gateway without limit: its answer may be at most
`max_response_bytes` (past it the connection is dropped and `ResponseTooLarge` raised, nothing
more buffered), and at most `max_connections` connections are open to it at once (a request
beyond them waits for one, within the request timeout). A connection the replica closes (vLLM
closes idle ones after 5 s) leaves the pool at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit

import httptools

from grm_service.config import Settings
from grm_service.errors import ResponseTooLarge
from grm_service.replicas.credentials import replica_headers

Answer = tuple[int, bytes]  # (HTTP status, body)
Body = tuple[bytes | memoryview, ...]  # sent one after the other

# Below this a body is copied into the same buffer as the head: one send, one packet.
_COALESCE_BYTES = 64 << 10


class UpstreamProtocolError(ConnectionError):
    """The replica answered something that is not an HTTP/1.1 response."""


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    tls: bool
    authority: str  # the Host header's value
    prefix: str  # a replica behind a path (an ingress's /vllm): its routes live under it
    credentials: str = ""  # header lines every request carries (replicas/credentials.py)

    @classmethod
    def parse(cls, base_url: str, headers: Mapping[str, str] | None = None) -> _Target:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        lines = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        return cls(parts.hostname, port, tls, parts.netloc, parts.path.rstrip("/"), lines)

    def head(self, path: str, length: int) -> bytes:
        return (f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.authority}\r\n"
                f"{self.credentials}Content-Type: application/json\r\n"
                f"Content-Length: {length}\r\n\r\n").encode()


class _Deadlines:
    """The connections awaiting an answer, each with its deadline, checked by one timer every
    `tick_s` while any awaits: a timer armed and cancelled per request cost ~2 us of CPU on the
    hot path. A deadline is met late by at most one tick."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.tick_s = min(1.0, timeout_s / 4)
        self.waiting: set[_Connection] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's

    def watch(self, conn: _Connection) -> None:
        loop = conn.loop
        conn.deadline = loop.time() + self.timeout_s
        self.waiting.add(conn)
        # Another loop: the last one's timer, if any, never runs again (a closed loop).
        if self._timer is None or self._loop is not loop:
            self._loop = loop
            self._timer = loop.call_later(self.tick_s, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for conn in [c for c in self.waiting if c.deadline <= now]:
            self.waiting.discard(conn)
            conn.time_out()
        self._timer = loop.call_later(self.tick_s, self._sweep, loop) if self.waiting else None


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request at a time."""

    deadline = 0.0  # of the answer awaited (`_Deadlines`), on the loop's clock

    def __init__(self, loop: asyncio.AbstractEventLoop, deadlines: _Deadlines,
                 ack_timeout_ms: int | None = None, max_response_bytes: int = 1 << 62,
                 on_lost: Callable[[_Connection], None] | None = None) -> None:
        self.loop = loop
        self.deadlines = deadlines  # the pool's (`Upstream`)
        self.ack_timeout_ms = ack_timeout_ms
        self.max_response_bytes = max_response_bytes
        self.on_lost = on_lost  # the pool forgets a closed connection at once
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.chunks: list[bytes] = []
        self.received = 0  # body bytes of the current answer
        self.waiter: asyncio.Future[Answer] | None = None
        self.answered_bytes = False  # a byte of the current answer arrived
        self.reusable = True

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # asyncio sets it too, uvloop only for some socket kinds; without it each request
            # waits for the replica's delayed ACK (~40 ms) once the body spans two packets.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            user_timeout = getattr(socket, "TCP_USER_TIMEOUT", None)
            if self.ack_timeout_ms is not None and user_timeout is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, user_timeout, self.ack_timeout_ms)

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # nothing was asked: e.g. a 408 before an idle close
            self.reusable = False
            return
        self.answered_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(UpstreamProtocolError(f"malformed HTTP response: {err}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._fail(ConnectionResetError("the replica closed the connection") if exc is None
                   else exc)
        if self.on_lost is not None:
            self.on_lost(self)

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        self.received += len(body)
        if self.received > self.max_response_bytes:
            self.chunks = []
            self._fail(ResponseTooLarge(
                f"the answer is over {self.max_response_bytes} bytes, the cap "
                "GRM_MAX_RESPONSE_BYTES sets"))
            return
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        if not self.parser.should_keep_alive():
            self.reusable = False
        waiter, self.waiter = self.waiter, None
        body = b"".join(self.chunks)
        self.chunks = []
        if waiter is not None and not waiter.done():
            waiter.set_result((self.parser.get_status_code(), body))

    def _fail(self, err: Exception) -> None:
        self.reusable = False
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(err)
        if self.transport is not None:
            self.transport.abort()

    def time_out(self) -> None:
        self._fail(TimeoutError("no complete answer in time"))

    def send(self, head: bytes, body: Body, length: int) -> asyncio.Future[Answer]:
        """Write the request; its answer is the future's, and `done` is owed once it is
        settled or given up (a future rather than a coroutine: one frame less per request)."""
        assert self.transport is not None
        waiter: asyncio.Future[Answer] = self.loop.create_future()
        self.waiter = waiter
        self.answered_bytes = False
        self.received = 0
        if length < _COALESCE_BYTES:
            self.transport.write(b"".join((head, *body)))
        else:
            self.transport.writelines((head, *body))
        self.deadlines.watch(self)
        return waiter

    def done(self) -> None:
        """The answer `send` waited for is in, or given up: its deadline is no longer watched."""
        self.deadlines.waiting.discard(self)

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()


@dataclass
class _Replica:
    """One replica URL's connections: the idle ones, and the slots bounding all of them."""

    url: str
    target: _Target
    slots: asyncio.Semaphore
    idle: list[_Connection] = field(default_factory=list)
    open: int = 0  # connections made and not yet lost
    users: int = 0  # requests inside `post`

    def forget(self, conn: _Connection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)


class Upstream:
    """A keep-alive pool per replica URL, with at most `max_connections` connections each: the
    gateway's in-flight gate, not the pool, decides how many requests a replica holds; this
    bound is what a replica costs in sockets if the gate is set wide."""

    def __init__(self, timeout_s: float, ack_timeout_s: float | None = None,
                 max_response_bytes: int = 64 << 20, max_connections: int = 256,
                 headers: Mapping[str, str] | None = None) -> None:
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.ack_timeout_ms = None if ack_timeout_s is None else int(ack_timeout_s * 1000)
        self.max_response_bytes = max_response_bytes
        self.max_connections = max_connections
        self._replicas: dict[str, _Replica] = {}
        self._open: set[_Connection] = set()
        self._deadlines = _Deadlines(timeout_s)

    @classmethod
    def from_settings(cls, settings: Settings) -> Upstream:
        return cls(settings.request_timeout_s, settings.replica_ack_timeout_s,
                   settings.max_response_bytes, settings.max_connections_per_replica,
                   replica_headers(settings))

    async def post(self, base_url: str, path: str, *body: bytes | memoryview) -> Answer:
        """POST the concatenation of `body`'s parts (a long string among them is not copied)."""
        replica = self._replicas.get(base_url)
        if replica is None:
            target = _Target.parse(base_url, self.headers)
            replica = self._replicas[base_url] = _Replica(
                base_url, target, asyncio.Semaphore(self.max_connections))
        length = sum(map(len, body))
        head = replica.target.head(path, length)
        replica.users += 1
        slots = replica.slots
        try:
            # Every holder and waiter is a user: with no more users than slots, one is free
            # and `acquire` returns at once, with no timer (cheaper than `slots.locked()`).
            if replica.users > self.max_connections:
                async with asyncio.timeout(self.timeout_s):
                    await slots.acquire()
            else:
                await slots.acquire()
            try:
                return await self._send(replica, head, body, length)
            finally:
                slots.release()
        finally:
            replica.users -= 1
            self._drop_if_unused(replica)

    async def _send(self, replica: _Replica, head: bytes, body: Body, length: int) -> Answer:
        idle = replica.idle
        conn = self._reused(idle)
        fresh = conn is None
        while True:
            if conn is None:
                conn = await self._connect(replica)
            try:
                answer = await conn.send(head, body, length)
            except BaseException as err:  # cancelled mid-answer too: its state is unknown
                conn.done()
                self._discard(conn)
                if fresh or not isinstance(err, ConnectionError) or conn.answered_bytes:
                    raise
                # The replica closed the idle connection as we reused it: nothing was answered,
                # so a fresh connection gets the same request.
                conn, fresh = None, True
                continue
            conn.done()
            if conn.reusable:
                idle.append(conn)
            else:
                self._discard(conn)
            return answer

    def _reused(self, idle: list[_Connection]) -> _Connection | None:
        """The most recently used idle connection (the least likely to be closed by now)."""
        while idle:
            conn = idle.pop()
            if conn.reusable:
                return conn
            self._discard(conn)  # closed, its connection_lost not yet run
        return None

    async def _connect(self, replica: _Replica) -> _Connection:
        loop = asyncio.get_running_loop()
        target = replica.target
        tls = ssl.create_default_context() if target.tls else None

        def lost(conn: _Connection) -> None:
            if conn in self._open:
                self._open.discard(conn)
                replica.open -= 1
            replica.forget(conn)
            self._drop_if_unused(replica)

        async with asyncio.timeout(self.timeout_s):
            _, conn = await loop.create_connection(
                lambda: _Connection(loop, self._deadlines, self.ack_timeout_ms,
                                    self.max_response_bytes, lost),
                target.host, target.port, ssl=tls, server_hostname=target.host if tls else None)
        self._open.add(conn)
        replica.open += 1
        return conn

    def _discard(self, conn: _Connection) -> None:
        conn.close()  # its connection_lost forgets it

    def _drop_if_unused(self, replica: _Replica) -> None:
        """A replica restarted on a new port leaves its old URL behind: nothing kept for it."""
        if replica.users == 0 and replica.open == 0 and self._replicas.get(replica.url) is replica:
            del self._replicas[replica.url]

    async def close(self) -> None:
        for conn in list(self._open):
            self._discard(conn)
        self._replicas.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks
