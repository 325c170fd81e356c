"""A replica that vanished without closing its connections: the gateway's replica connections
bound unacknowledged sends (TCP_USER_TIMEOUT), and a request that waited for a slot on a replica
which went down meanwhile fails over instead of being sent. (The end-to-end case, a replica
container cut off its network, runs in tests/compose/check_stack.py.)"""

from __future__ import annotations

import asyncio
import socket
import sys

import pytest

from grm_service import proxy
from grm_service.config import Settings
from grm_service.metrics import Metrics
from grm_service.replicas import Replica, ReplicaPool, ReplicaState
from grm_service.upstream import Upstream

SETTINGS = Settings(model="/models/m", queue_timeout_s=5)
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
        (conn,) = pool._idle[url]
        assert conn.transport is not None
        sock = conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == expected_ms
    finally:
        await pool.close()
        await asyncio.wait_for(replica.closed.wait(), 5)
        server.close()
        await server.wait_closed()


async def test_a_request_waiting_on_a_replica_that_went_down_fails_over() -> None:
    replica = Replica("r0", "http://127.0.0.1:9", state=ReplicaState.READY)
    gw = proxy.Gateway(settings=SETTINGS, pool=ReplicaPool([replica]), client=Upstream(5.0),
                       metrics=Metrics())
    await proxy._admit(gw, replica, alone=True)  # the request in flight holds the slot
    waiting = asyncio.create_task(proxy._admit(gw, replica, alone=True))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    replica.state = ReplicaState.DOWN  # the keeper saw it die
    await replica.gate.release(True)  # the request in flight failed
    with pytest.raises(proxy._Retryable, match="went down while the request waited"):
        await waiting
    assert replica.gate.inflight == 0 and gw.queued == 0
