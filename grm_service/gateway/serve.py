"""uvicorn with a drain phase: the first SIGTERM/SIGINT stops admitting work and lets in-flight
requests finish (bounded) before the normal shutdown stops the replicas. A second signal skips
the wait."""

from __future__ import annotations

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


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, service: Service, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.service = service
        self.drain_timeout_s = drain_timeout_s
        self._drain_requested = False
        self._drain_since: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Only record; on_tick acts. A repeated signal falls through to uvicorn's own handling.
        if self._drain_requested:
            super().handle_exit(sig, frame)
        self._drain_requested = True

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
        server.should_exit = True

    config.app = create_app(service, on_fatal=fatal)
    settle_collector()
    # Server.run uses uvicorn's loop factory (uvloop when installed); asyncio.run(serve())
    # would silently run the stock asyncio loop.
    server.run(sockets=[worker.socket()] if worker else None)
    return 1 if failure else 0
