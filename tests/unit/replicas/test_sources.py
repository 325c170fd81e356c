"""Replica sources: a local child process (here the STUB backend, launched as an engine would
be) on a fresh port at each start, and an attached address that is only located."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx

from grm_service.config import Settings
from grm_service.engines import ReplicaSpec
from grm_service.replicas.sources import (
    AttachedSource,
    LocalSource,
    attached_sources,
    local_sources,
)
from tests.support.procs import pids_alive
from tests.support.stub_engine import StubEngine


async def healthy(url: str, timeout_s: float = 20) -> int:
    async with httpx.AsyncClient() as client, asyncio.timeout(timeout_s):
        while True:
            try:
                return (await client.get(url + "/health")).status_code
            except httpx.TransportError:
                await asyncio.sleep(0.05)


async def test_a_local_source_runs_its_replica_and_stops_it(tmp_path: Path) -> None:
    source = LocalSource(StubEngine(Settings(model="m", work_dir=tmp_path)), 1)
    assert (source.name, source.pid, source.owns_process) == ("r1", None, True)
    url = await source.start()
    try:
        assert url.startswith("http://127.0.0.1:") and await healthy(url) == 200
        pid = source.pid
        assert pid is not None and pids_alive([pid]) == [pid]
        assert await source.exited() is None
        assert (tmp_path / "r1" / "replica.log").exists()
    finally:
        await source.stop(5.0)
    assert source.pid is None and pids_alive([pid]) == []
    assert (await source.tail()).startswith(f"(log {tmp_path / 'r1' / 'replica.log'})")


async def test_a_local_replica_that_dies_is_seen_exited(tmp_path: Path) -> None:
    class Dying(StubEngine):
        def argv(self, spec: ReplicaSpec, host: str) -> list[str]:
            return [sys.executable, "-c", "import sys; print('no model here'); sys.exit(4)"]

    source = LocalSource(Dying(Settings(model="m", work_dir=tmp_path)), 0)
    await source.start()
    try:
        async with asyncio.timeout(20):
            while (why := await source.exited()) is None:
                await asyncio.sleep(0.05)
        assert why == "exited (4)"
        assert "no model here" in await source.tail()
    finally:
        await source.stop(1.0)


async def test_each_start_takes_a_fresh_port(tmp_path: Path) -> None:
    source = LocalSource(StubEngine(Settings(model="m", work_dir=tmp_path)), 0)
    ports = {source.spec().port for _ in range(5)}
    assert len(ports) > 1


async def test_attached_sources_locate_the_given_addresses() -> None:
    settings = Settings(replica_urls=["http://a:1/", "http://b:2"])
    sources = attached_sources(settings)
    assert [s.name for s in sources] == ["r0", "r1"]
    assert [await s.start() for s in sources] == ["http://a:1", "http://b:2"]
    assert all(isinstance(s, AttachedSource) and not s.owns_process for s in sources)
    assert await sources[0].exited() is None and sources[0].pid is None


def test_local_sources_one_per_replica(tmp_path: Path) -> None:
    sources = local_sources(StubEngine(Settings(model="m", replicas=3, work_dir=tmp_path)))
    assert [s.name for s in sources] == ["r0", "r1", "r2"]
    assert all(isinstance(s, LocalSource) for s in sources)
