"""The keeper's health checks over the gateway's own client, against real sockets on
127.0.0.1: a server in this process that answers `/health` as each test tells it to."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from grm_service.gateway.request.health import health_check, health_pool
from grm_service.gateway.request.upstream import Upstream
from grm_service.replicas.keeper import Probe
from tests.support.procs import free_port


class Replica:
    """Answers each request with `status` (None: reads it and never answers); counts its
    connections and requests."""

    def __init__(self, status: int | None) -> None:
        self.status = status
        self.connections = 0
        self.requests: list[bytes] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                self.requests.append(head)
                if self.status is None:
                    await asyncio.sleep(3600)
                writer.write(b"HTTP/1.1 %d X\r\ncontent-length: 2\r\n\r\nok" % self.status)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def replica_at() -> AsyncIterator[tuple[Replica, str]]:
    replica = Replica(200)
    server = await asyncio.start_server(replica.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield replica, f"http://127.0.0.1:{port}/prefix"
    finally:
        server.close()


async def test_a_healthy_replica_is_checked_on_one_kept_alive_connection(
    replica_at: tuple[Replica, str],
) -> None:
    replica, url = replica_at
    pool = health_pool()
    check = health_check(pool)
    try:
        assert [await check(url) for _ in range(3)] == [Probe.OK] * 3
    finally:
        await pool.close()
    assert replica.connections == 1
    assert replica.requests[0].startswith(b"GET /prefix/health HTTP/1.1\r\nHost: 127.0.0.1:")


@pytest.mark.parametrize("status", [500, 503, 404])
async def test_another_status_is_bad(replica_at: tuple[Replica, str], status: int) -> None:
    replica, url = replica_at
    replica.status = status
    pool = health_pool()
    try:
        assert await health_check(pool)(url) is Probe.BAD
    finally:
        await pool.close()


async def test_a_replica_that_does_not_answer_is_bad_within_the_timeout(
    replica_at: tuple[Replica, str],
) -> None:
    replica, url = replica_at
    replica.status = None
    pool = Upstream(0.3)
    try:
        async with asyncio.timeout(10):
            assert await health_check(pool)(url) is Probe.BAD
    finally:
        await pool.close()


async def test_nothing_listening_is_refused() -> None:
    pool = health_pool()
    try:
        assert await health_check(pool)(f"http://127.0.0.1:{free_port()}") is Probe.REFUSED
    finally:
        await pool.close()
