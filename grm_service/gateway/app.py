"""The FastAPI app factory and its lifespan, which builds every shared object."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import httpx
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from grm_service import __version__
from grm_service.config import Settings
from grm_service.dual_scales import DualScales, ScalesError, read_dual_scales
from grm_service.errors import ConfigError, GrmError, MethodNotAllowed, UnknownRoute
from grm_service.gateway.edge import (
    routes_admin,
    routes_engines,
    routes_gym,
    routes_integrations,
    routes_ledger,
    routes_openai,
    routes_score,
)
from grm_service.gateway.edge.bad_json import invalid_json
from grm_service.gateway.edge.guards import Guards
from grm_service.gateway.edge.hotpath import CHAT, CLASSIFY, HotPath
from grm_service.gateway.edge.middleware import MetricsMiddleware
from grm_service.gateway.edge.replies import ReplyResponse, error_reply, validation_reply
from grm_service.gateway.edge.score_body import add_score_schema
from grm_service.gateway.request.audit import Auditor
from grm_service.gateway.request.context import ForwardContext
from grm_service.gateway.request.upstream import Upstream
from grm_service.gateway.role import WorkerRole
from grm_service.gateway.service import Service
from grm_service.ledger.book import Ledger
from grm_service.metrics import Metrics
from grm_service.replicas.credentials import probe_client
from grm_service.replicas.deployment import keeper_for
from grm_service.replicas.identity import ServiceIdentity
from grm_service.replicas.pool import ReplicaPool
from grm_service.scoring.presets import scorer_names as _scorer_names
from grm_service.worker_side.gates import GateFile
from grm_service.worker_side.snapshot import Follower

log = logging.getLogger(__name__)

OnFatal = Callable[[str], None]


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


class ReplicaSide(Protocol):
    """Whoever keeps this process's replica pool current."""

    pool: ReplicaPool

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def _replica_side(
    settings: Settings, worker: WorkerRole | None, metrics: Metrics, identity: ServiceIdentity,
    probes: httpx.AsyncClient,
) -> tuple[ReplicaSide, Callable[[], Awaitable[None]]]:
    """One process: the keeper itself. With `--workers N` the keeper runs in a process of its
    own (workers/keeper_process.py) and every serving worker follows the replica set it
    publishes, every replica's gate shared by all of them."""
    if worker is None:
        kept = keeper_for(settings, metrics, identity, probes)
        return kept.keeper, kept.close
    gates = GateFile(worker.gates_path, worker.index, worker.count)

    async def close() -> None:
        gates.close()  # closing the file drops this process's locks

    return Follower(worker.snapshot_path, gates.gate, identity, tend=gates.tend,
                    quiet=gates.quiet), close


async def _flush_metrics(metrics: Metrics, worker: WorkerRole | None) -> None:
    """Every second: the request path's pending metric updates (tally.py), and with workers
    `grm_worker_requests`, which worker answers how much (the counter moves by what this
    process answered since)."""
    counter = None
    if worker is not None and metrics.worker_requests is not None:
        counter = metrics.worker_requests.labels(worker=str(worker.index))
    counted = 0.0
    while True:
        await asyncio.sleep(1.0)
        if counter is None:
            metrics.tally.flush()
            continue
        answered = metrics.answered()  # flushes the tally first
        if answered > counted:
            counter.inc(answered - counted)
            counted = answered


def _lifespan(
    service: Service, on_fatal: OnFatal | None
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    settings, worker, metrics = service.settings, service.worker, service.metrics

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # A bad --scorers entry fails start-up rather than the first request.
        log.info("scorers: %s", ", ".join(routes_gym.check_scorer(settings,
                                                                 scorer_names(settings))))
        probes = probe_client(settings)
        identity = ServiceIdentity(settings, metrics)  # the one holder of this process
        side, close_side = _replica_side(settings, worker, metrics, identity, probes)
        # Our own keep-alive pool, not httpx/aiohttp: upstream.py says why.
        client = Upstream.from_settings(settings)
        # With N workers each one audits at 1/N of the rate: the limit holds for the service.
        audit_rate = settings.audit_max_per_s / (worker.count if worker else 1)
        auditor = Auditor(settings.audit_fraction, audit_rate, metrics)
        ledger = Ledger(settings, metrics) if settings.ledger else None
        gw = ForwardContext(settings=settings, pool=side.pool, client=client, metrics=metrics,
                     identity=identity, auditor=auditor, ledger=ledger, scales=_scales(settings),
                     look=side.look if isinstance(side, Follower) else None,
                     refusals=service.refusals)
        await service.held.start()
        service.start(gw)
        background = [asyncio.create_task(side.start(), name="grm-start")]
        background[0].add_done_callback(lambda task: _report_start(on_fatal, task))
        if ledger is not None:
            ledger.start()
        background.append(asyncio.create_task(_flush_metrics(metrics, worker)))
        pings = contextlib.ExitStack()
        if worker is not None:
            pings.enter_context(worker.answer_pings())
        try:
            yield
        finally:
            gw.draining = True
            for task in background:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await auditor.close()
            await service.held.close()
            if ledger is not None:
                await ledger.close()  # what the drain answered is written before the exit
            metrics.tally.flush()  # with workers, a later /metrics reads this one's file
            pings.close()
            await side.stop()
            await close_side()
            await probes.aclose()
            await client.close()

    return lifespan


def _scales(settings: Settings) -> DualScales | None:
    """The served dual encoder's scalars, once (the `clip` scorer's); a checkpoint that claims to
    be one and cannot be read fails the start, as a bad --scorers entry does."""
    if not settings.model:
        return None
    try:
        # The hub cache the replicas use: the user's engine env over this process's.
        scales = read_dual_scales(settings.model, {**os.environ, **settings.engine_env})
    except ScalesError as err:
        raise ConfigError(f"the clip scorer's scalars: {err}") from err
    if scales is not None:
        log.info("dual encoder %s: logit_scale %r, logit_bias %r (from %s)", scales.architecture,
                 scales.logit_scale, scales.logit_bias, scales.source)
    return scales


async def _grm_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GrmError)
    return ReplyResponse(error_reply(exc))


async def _validation_error(request: Request, exc: Exception) -> Response:
    """pydantic's verdict; a body FastAPI could not parse is worded from its bytes (read and
    kept by the route's request, which this handler is given)."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if errors and errors[0].get("type") == "json_invalid":
        return ReplyResponse(error_reply(invalid_json(await request.body())))
    return ReplyResponse(validation_reply(errors))


async def _http_error(request: Request, exc: Exception) -> Response:
    """The framework's own refusals in OpenAI's shape: no such route, a method the route does
    not take, a body that is not UTF-8 (FastAPI's "error parsing the body")."""
    assert isinstance(exc, StarletteHTTPException)
    where = f"{request.method} {request.url.path}"
    err: GrmError
    if exc.status_code == 400 and isinstance(exc.__cause__, ValueError):
        err = invalid_json(await request.body())
    elif exc.status_code == 404:
        err = UnknownRoute(f"no route for {where}: the routes are listed at /docs")
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "another method")
        err = MethodNotAllowed(f"{where} is not served: this route takes {allowed}")
    else:
        return await http_exception_handler(request, exc)
    return ReplyResponse(error_reply(err, exc.headers))


def create_app(service: Service, on_fatal: OnFatal | None = None) -> HotPath:
    """The hot routes (edge/hotpath.py) in front of the FastAPI app, which serves the rest;
    every edge holds `service`, the one composition root."""
    settings = service.settings
    app = FastAPI(title="grm-service", version=__version__,
                  lifespan=_lifespan(service, on_fatal))
    app.state.service = service  # the routes' dependencies (edge/deps.py) read it
    app.add_exception_handler(GrmError, _grm_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(Guards, settings=settings, admission=service.admission)
    app.add_middleware(MetricsMiddleware, requests=service.requests,
                       served=frozenset({CHAT, CLASSIFY}))
    app.include_router(routes_admin.router)
    app.include_router(routes_engines.router)
    app.include_router(routes_openai.router)
    app.include_router(routes_score.router)
    app.include_router(routes_integrations.router)
    app.include_router(routes_gym.router)
    app.include_router(routes_ledger.router)
    _with_score_schema(app, settings)
    hot = app.state.hot = HotPath(app, service)  # the hot routes' one door (routes call it)
    return hot


def scorer_names(settings: Settings) -> list[str]:
    return _scorer_names(settings.scorer_presets, tuple(settings.scorers))


def _with_score_schema(app: FastAPI, settings: Settings) -> None:
    """/v1/score reads its own body (in chunks): its schema is added to the generated one."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            add_score_schema(generate(), scorer_names(settings))
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]
