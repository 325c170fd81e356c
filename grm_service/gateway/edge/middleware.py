"""Request metrics as plain ASGI middleware (no per-request task or body copy)."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from grm_service.metrics import Metrics


class MetricsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        seen: dict[str, str] = {"status": "500", "replica": ""}

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = str(message["status"])
                for key, value in message.get("headers", []):
                    if key == b"x-grm-replica":
                        seen["replica"] = value.decode()
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            self._record(scope, seen, time.perf_counter() - start)

    @staticmethod
    def _record(scope: Scope, seen: dict[str, str], seconds: float) -> None:
        state = getattr(scope.get("app"), "state", None)
        gateway = getattr(state, "gateway", None)
        metrics: Metrics | None = getattr(gateway, "metrics", None)
        if metrics is None:
            return
        route = scope.get("route")
        path = getattr(route, "path", "unmatched")
        metrics.requests.labels(route=path, status=seen["status"], replica=seen["replica"]).inc()
        metrics.latency.labels(route=path).observe(seconds)
