"""uvicorn with a drain phase, serving on 127.0.0.1 port 0 in this process: the first signal
stops admitting work and waits (bounded) for in-flight requests; a second skips the wait."""

from __future__ import annotations

import asyncio
import signal

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from grm_service.config import Settings
from grm_service.gateway import serve
from grm_service.gateway.edge.hotpath import HotPath
from grm_service.gateway.request.context import ForwardContext
from grm_service.gateway.request.upstream import Upstream
from grm_service.gateway.serve import DrainingServer
from grm_service.gateway.service import Service
from grm_service.replicas.identity import ServiceIdentity
from grm_service.replicas.pool import ReplicaPool

SETTINGS = Settings(model="m")


def gateway_app() -> tuple[HotPath, ForwardContext]:
    """The app as create_app shapes it (HotPath around FastAPI, both holding the service)."""
    app = FastAPI()
    service = Service(SETTINGS)
    gw = ForwardContext(settings=SETTINGS, pool=ReplicaPool([]), client=Upstream(1.0),
                 metrics=service.metrics, identity=ServiceIdentity(SETTINGS))
    service.start(gw)

    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"draining": gw.draining}

    return HotPath(app, service), gw


def server_for(app: object, drain_timeout_s: float) -> DrainingServer:
    service = app.service if isinstance(app, HotPath) else Service(SETTINGS)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_config=None)
    return DrainingServer(config, service, drain_timeout_s)


async def started(server: DrainingServer) -> asyncio.Task[None]:
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(10):
        while not server.started:
            await asyncio.sleep(0.01)
    return task


async def test_a_signal_drains_in_flight_work_before_the_server_exits() -> None:
    app, gw = gateway_app()
    server = server_for(app, drain_timeout_s=30)
    task = await started(server)
    port = server.servers[0].sockets[0].getsockname()[1]
    gw.queued = 1  # a request in flight
    server.handle_exit(signal.SIGTERM, None)
    await asyncio.sleep(0.35)  # several of uvicorn's ticks
    assert gw.draining and not server.should_exit and not task.done()
    async with httpx.AsyncClient() as client:
        r = await client.get(f"http://127.0.0.1:{port}/health")
    assert r.json() == {"draining": True}, "still serving while draining"
    gw.queued = 0
    await asyncio.wait_for(task, 10)
    assert server.should_exit


async def test_the_drain_is_bounded() -> None:
    app, gw = gateway_app()
    server = server_for(app, drain_timeout_s=0.2)
    task = await started(server)
    gw.queued = 1  # never finishes
    server.handle_exit(signal.SIGTERM, None)
    await asyncio.wait_for(task, 10)
    assert gw.draining and server.should_exit


def test_a_second_signal_exits_at_once() -> None:
    app, gw = gateway_app()
    server = server_for(app, drain_timeout_s=30)
    server.handle_exit(signal.SIGINT, None)
    assert not server.should_exit
    server.handle_exit(signal.SIGINT, None)
    assert server.should_exit and not gw.draining


async def test_without_a_gateway_the_drain_ends_at_once() -> None:
    async def bare(scope: object, receive: object, send: object) -> None:
        raise AssertionError("not called")

    server = server_for(bare, drain_timeout_s=30)
    task = await started(server)
    server.handle_exit(signal.SIGTERM, None)
    await asyncio.wait_for(task, 5)
    assert server.should_exit


class Counted(DrainingServer):
    """Counts the main loop's turns."""

    turns = 0

    async def on_tick(self, counter: int) -> bool:
        self.turns += 1
        return await super().on_tick(counter)


async def test_an_idle_server_turns_once_a_second_not_ten_times() -> None:
    config = uvicorn.Config(gateway_app()[0], host="127.0.0.1", port=0, lifespan="off",
                            log_config=None)
    server = Counted(config, Service(SETTINGS), drain_timeout_s=30)
    task = await started(server)
    before = server.turns
    await asyncio.sleep(1.5)
    turns = server.turns - before
    server.handle_exit(signal.SIGTERM, None)
    await asyncio.wait_for(task, 10)
    assert 1 <= turns <= 3, f"{turns} turns in 1.5 s"  # uvicorn's own loop: about 15
    assert server.server_state.default_headers[0][0] == b"date"


@pytest.mark.parametrize("how", ["signal", "exit"])
async def test_a_signal_or_exit_ends_the_idle_wait_at_once(
    monkeypatch: pytest.MonkeyPatch, how: str,
) -> None:
    """With an idle turn of a minute, only the wake-up can stop the server within seconds."""
    monkeypatch.setattr(serve, "_IDLE_TURN_S", 60.0)
    app, _ = gateway_app()
    server = server_for(app, drain_timeout_s=30)
    task = await started(server)
    await asyncio.sleep(0.2)  # waiting in its first idle turn
    if how == "signal":
        server.handle_exit(signal.SIGTERM, None)
    else:
        server.exit()
    await asyncio.wait_for(task, 10)
    assert server.should_exit
