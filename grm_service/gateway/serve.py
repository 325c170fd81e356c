"""uvicorn with a drain phase: the first SIGTERM/SIGINT stops admitting work and lets in-flight
requests finish (bounded) before the normal shutdown stops the replicas. A second signal skips
the wait."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from types import FrameType

import uvicorn

from grm_service.config import Settings
from grm_service.gateway.app import create_app
from grm_service.gateway.edge.protocol import EdgeProtocol
from grm_service.gateway.edge.protocol_check import protocol_for
from grm_service.gateway.heap import keep_freed_memory, settle_collector
from grm_service.gateway.role import WorkerRole
from grm_service.gateway.service import Service

log = logging.getLogger(__name__)


# uvicorn's main loop turns every 0.1 s to update its date header once a second and to see a
# signal: ten wake-ups a second of every idle worker, the most after the replica snapshot's.
# Here an idle turn lasts a second, a signal or `exit` ends the wait at once, and while
# draining a turn lasts 0.1 s, so that the drain ends soon after the last request.
_IDLE_TURN_S = 1.0
_DRAIN_TURN_S = 0.1


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, service: Service, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.service = service
        self.drain_timeout_s = drain_timeout_s
        self._drain_requested = False
        self._drain_since: float | None = None
        self._woken: asyncio.Event | None = None  # ends the main loop's wait (a signal, exit)
        self._loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Only record; on_tick acts. A repeated signal falls through to uvicorn's own handling.
        if self._drain_requested:
            super().handle_exit(sig, frame)
        self._drain_requested = True
        self._wake()

    def exit(self) -> None:
        """Stop serving now, without a drain (a fatal start-up error)."""
        self.should_exit = True
        self._wake()

    def _wake(self) -> None:
        if self._loop is not None and self._woken is not None and not self._loop.is_closed():
            # Thread-safe: a signal handler may run while the loop waits in its poll.
            self._loop.call_soon_threadsafe(self._woken.set)

    async def main_loop(self) -> None:
        """uvicorn's main loop (the version bound in pyproject.toml), with the turns above."""
        self._loop, self._woken = asyncio.get_running_loop(), asyncio.Event()
        dated = time.monotonic()
        should_exit = await self.on_tick(0)  # 0: the date header is brought up to date
        while not should_exit:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_DRAIN_TURN_S if self._drain_requested
                                           else _IDLE_TURN_S):
                    await self._woken.wait()
            self._woken.clear()
            now = time.monotonic()
            stale = now - dated >= _IDLE_TURN_S - _DRAIN_TURN_S / 2
            if stale:
                dated = now
            should_exit = await self.on_tick(0 if stale else 1)

    async def on_tick(self, counter: int) -> bool:
        if self._drain_requested and not self.should_exit:
            self._drain_step()
        return await super().on_tick(counter)

    def _drain_step(self) -> None:
        now = time.monotonic()
        if self._drain_since is None:
            self._drain_since = now
            self.service.drain()
            log.info("draining: new requests get 503; waiting up to %.0f s for in-flight work",
                     self.drain_timeout_s)
        busy = self.service.inflight
        if busy == 0 or now - self._drain_since >= self.drain_timeout_s:
            log.info("drained (%d request(s) still in flight); shutting down", busy)
            self.should_exit = True


def run_server(
    settings: Settings, log_level: str = "info", worker: WorkerRole | None = None
) -> int:
    """Serve until a signal or a fatal start-up error; the exit code says which. `worker` is set
    in each serving process of `serve --workers N` (grm_service/workers/)."""
    failure: list[str] = []
    keep_freed_memory(settings.malloc_keep_bytes)
    service = Service(settings, worker)
    protocol = protocol_for(service)
    config = uvicorn.Config(None, host=settings.host, port=settings.port,  # type: ignore[arg-type]
                            log_level=log_level, lifespan="on", timeout_graceful_shutdown=30,
                            timeout_keep_alive=settings.keep_alive_s,
                            access_log=settings.access_log,
                            # X-Forwarded-For only changes the client address the access log shows.
                            proxy_headers=settings.access_log,
                            # uvicorn's own bound, only where the check fell back to its protocol
                            limit_concurrency=(None if issubclass(protocol, EdgeProtocol)
                                               else settings.max_connections),
                            ws="none", http=protocol)
    server = DrainingServer(config, service, settings.drain_timeout_s)

    def fatal(message: str) -> None:
        failure.append(message)
        server.exit()

    config.app = create_app(service, on_fatal=fatal)
    settle_collector()
    # Server.run uses uvicorn's loop factory (uvloop when installed); asyncio.run(serve())
    # would silently run the stock asyncio loop.
    server.run(sockets=[worker.socket()] if worker else None)
    return 1 if failure else 0
