"""Request metrics as ASGI middleware: one count per request by route template, status and
the replica that answered, and its latency; a failed handler counts as 500."""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from grm_service.gateway.edge.middleware import MetricsMiddleware, RequestMetrics
from grm_service.metrics import Metrics


def app_with(metrics: Metrics) -> FastAPI:
    app = FastAPI()
    app.add_middleware(MetricsMiddleware, requests=RequestMetrics(metrics))

    @app.get("/items/{name}")
    async def item(name: str) -> JSONResponse:
        return JSONResponse({"name": name}, headers={"x-grm-replica": "r1"})

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("handler failed")

    return app


def count(metrics: Metrics, route: str, status: str, replica: str = "") -> float | None:
    return metrics.registry.get_sample_value(
        "grm_requests_total", {"route": route, "status": status, "replica": replica})


async def test_requests_are_counted_by_route_template_status_and_replica() -> None:
    metrics = Metrics()
    transport = httpx.ASGITransport(app=app_with(metrics), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as api:
        for name in ("a", "b"):
            assert (await api.get(f"/items/{name}")).status_code == 200
        assert (await api.get("/nowhere")).status_code == 404
        assert (await api.get("/boom")).status_code == 500
    assert count(metrics, "/items/{name}", "200", "r1") == 2.0
    assert count(metrics, "unmatched", "404") == 1.0
    assert count(metrics, "/boom", "500") == 1.0
    latency = metrics.registry.get_sample_value("grm_request_duration_seconds_count",
                                                {"route": "/items/{name}"})
    assert latency == 2.0


async def test_the_answer_passes_through_untouched() -> None:
    transport = httpx.ASGITransport(app=app_with(Metrics()))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as api:
        r = await api.get("/items/x")
    assert r.json() == {"name": "x"} and r.headers["x-grm-replica"] == "r1"
