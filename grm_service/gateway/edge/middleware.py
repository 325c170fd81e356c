"""The one metrics path of the edge: every answered request counted by route, status and the
replica that answered, and its latency; the hot path records through the same object as the
middleware around FastAPI."""

from __future__ import annotations

import time

from prometheus_client import Counter, Histogram
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from grm_service.metrics import Metrics

_REPLICA = b"x-grm-replica"  # set by fingerprint_headers on every answer


class RequestMetrics:
    """`grm_requests` and `grm_request_duration_seconds`, their label children cached (a
    `labels()` call takes a lock and builds tuples), updated through the tally."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.tally = metrics.tally
        self._counters: dict[tuple[str, int, str], Counter] = {}
        self._latency: dict[str, Histogram] = {}

    def record(self, route: str, status: int, replica: str, seconds: float) -> None:
        key = (route, status, replica)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = self.metrics.requests.labels(
                route=route, status=str(status), replica=replica)
        latency = self._latency.get(route)
        if latency is None:
            latency = self._latency[route] = self.metrics.latency.labels(route=route)
        self.tally.add(counter)
        self.tally.observe(latency, seconds)


class MetricsMiddleware:
    """Around the FastAPI app: the route template, the status sent and the replica header; a
    failed handler counts as 500. The routes in `served` count their own answers (the hot
    routes: `HotPath.serve` counts every answer it gives, whichever edge asked)."""

    def __init__(self, app: ASGIApp, requests: RequestMetrics,
                 served: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.requests = requests
        self.served = served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        seen: list[object] = [500, ""]

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen[0] = message["status"]
                for key, value in message.get("headers", []):
                    if key == _REPLICA:
                        seen[1] = value.decode()
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = scope.get("route")
            path = route.path if isinstance(route, Route) else "unmatched"
            status, replica = seen
            assert isinstance(status, int) and isinstance(replica, str)
            if path not in self.served:
                self.requests.record(path, status, replica, time.perf_counter() - start)
