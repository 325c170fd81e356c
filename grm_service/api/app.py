"""The FastAPI app factory and its lifespan, which builds every shared object."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from grm_service import __version__
from grm_service.api import routes_admin, routes_integrations, routes_openai, routes_score
from grm_service.api.guards import Guards
from grm_service.api.middleware import MetricsMiddleware
from grm_service.attach import AttachedReplicas
from grm_service.audit import Auditor
from grm_service.canary import Canary
from grm_service.config import Launcher, SerializeMode, Settings
from grm_service.engines import Engine, select_engine
from grm_service.errors import GrmError, error_body
from grm_service.identity import build_identity
from grm_service.metrics import Metrics
from grm_service.proxy import Gateway
from grm_service.replicas import ReplicaPool
from grm_service.scoring.registry import registered
from grm_service.supervisor import Supervisor

log = logging.getLogger(__name__)

OnFatal = Callable[[str], None]


class ReplicaSource(Protocol):
    pool: ReplicaPool

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def _always_serialized(engine: Engine, mode: SerializeMode) -> bool:
    if mode is not SerializeMode.AUTO:
        return mode is SerializeMode.ON
    return not engine.capabilities().batch_invariant


def _source(settings: Settings, engine: Engine, metrics: Metrics) -> ReplicaSource:
    checks = [Canary(settings, metrics)] if settings.canary else []
    if settings.attach:
        return AttachedReplicas(settings, metrics, checks=checks)
    if settings.launcher is Launcher.RAY:
        # Imported here: Ray is an optional extra (`grm-service[ray]`).
        from grm_service.launchers.ray import RayReplicas

        return RayReplicas(settings, engine, metrics, checks)
    return Supervisor(settings, engine, metrics, checks)


def _report_start(on_fatal: OnFatal | None, task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    err = task.exception()
    if err is None:
        log.info("service ready")
        return
    message = err.message if isinstance(err, GrmError) else repr(err)
    log.error("start-up failed: %s", message)
    if on_fatal is not None:
        on_fatal(message)


def _lifespan(
    settings: Settings, on_fatal: OnFatal | None
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # A bad --scorers entry fails start-up rather than the first request.
        log.info("scorers: %s", ", ".join(registered(tuple(settings.scorers))))
        metrics = Metrics()
        engine = select_engine(settings)
        serialized = _always_serialized(engine, settings.serialize)
        identity = await asyncio.to_thread(build_identity, settings, engine, serialized)
        source = _source(settings, engine, metrics)
        # aiohttp, not httpx, for the hot path: httpcore's pool rescans every connection (some
        # checks O(n) each) on each request, so its cost grows with concurrency.
        client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                       skip_auto_headers=("User-Agent",))
        auditor = Auditor(settings.audit_fraction, settings.audit_max_per_s, metrics)
        gw = Gateway(settings=settings, identity=identity, capabilities=engine.capabilities(),
                     pool=source.pool, client=client, metrics=metrics, auditor=auditor)
        metrics.info.info({"seed": str(settings.seed), "fingerprint": identity.fingerprint_id,
                           "engine": engine.name, "version": __version__})
        app.state.gateway = gw
        log.info("identity %s (model %s, env %s)", identity.fingerprint_id,
                 identity.model_hash, identity.env_digest)
        starting = asyncio.create_task(source.start(), name="grm-start")
        starting.add_done_callback(lambda task: _report_start(on_fatal, task))
        try:
            yield
        finally:
            gw.draining = True
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting
            await auditor.close()
            await source.stop()
            await client.close()

    return lifespan


async def _grm_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GrmError)
    headers = {"retry-after": str(max(1, round(exc.retry_after)))} if exc.retry_after else None
    return JSONResponse(error_body(exc), status_code=exc.http_status, headers=headers)


def create_app(settings: Settings, on_fatal: OnFatal | None = None) -> FastAPI:
    app = FastAPI(title="grm-service", version=__version__,
                  lifespan=_lifespan(settings, on_fatal))
    app.add_exception_handler(GrmError, _grm_error)
    app.add_middleware(Guards, settings=settings)
    app.add_middleware(MetricsMiddleware)
    app.include_router(routes_admin.router)
    app.include_router(routes_openai.router)
    app.include_router(routes_score.router)
    app.include_router(routes_integrations.router)
    return app
