"""Every Prometheus metric of the service, on a registry the app factory owns."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "grm_requests", "Requests answered, by route, status and replica.",
            ["route", "status", "replica"], registry=r,
        )
        self.latency = Histogram(
            "grm_request_duration_seconds", "Gateway latency of answered requests.",
            ["route"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.inflight = Gauge(
            "grm_requests_in_flight", "Requests being forwarded, by replica.", ["replica"],
            registry=r,
        )
        self.replica_up = Gauge(
            "grm_replica_up", "1 when the replica is ready to serve.", ["replica"], registry=r
        )
        self.replica_restarts = Counter(
            "grm_replica_restarts", "Restarts of a replica after a crash.", ["replica"],
            registry=r,
        )
        self.backend_failures = Counter(
            "grm_backend_failures", "Failed attempts at a replica (then failed over).",
            ["replica", "reason"], registry=r,
        )
        self.violations = Counter(
            "grm_determinism_violations", "Outputs that should have been equal and were not.",
            ["source"], registry=r,
        )
        self.audits = Counter(
            "grm_audits", "Requests re-run on another replica, by outcome.", ["outcome"],
            registry=r,
        )
        self.replica_serialized = Gauge(
            "grm_replica_serialized", "1 when the replica runs one request at a time.",
            ["replica"], registry=r,
        )
        self.score_items = Counter(
            "grm_score_items", "Scored items, by scorer and status (ok or error): a batch "
            "answered 200 can still hold failed items.", ["scorer", "status"], registry=r,
        )
        self.info = Info("grm_service", "Service identity.", registry=r)
