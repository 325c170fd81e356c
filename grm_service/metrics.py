"""Every Prometheus metric of the service, on a registry the app factory owns.

With `--workers N` each worker process writes its values to prometheus_client's multiprocess
files (the worker is started with PROMETHEUS_MULTIPROC_DIR) and `/metrics`, on any worker, shows
them merged: counters and histograms summed, in-flight gauges summed over live workers, replica
gauges as the keeper's process sets them. `Info` has no multiprocess form: each worker shows its
own, the same in every worker (the service identity comes from the one snapshot).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from grm_service.tally import Tally

# Where the workers of `serve --workers N` write their values (workers.py sets it for them).
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Up to the longest request the gateway lets run (GRM_REQUEST_TIMEOUT_S, 600 s by default): a
# reward step stuck on a slow judge must land in a bucket, not only in +Inf.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
                    450, 600)
# A short error text as a label: one line, bounded, so a replica cannot mint unbounded series.
ERROR_LABEL_CHARS = 160


class _FlushFirst:
    """Registered first: any read of the registry (a scrape, a test's sample) collects the
    request path's pending updates (`Tally`) before the metrics they go to."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def collect(self) -> Iterable[Metric]:
        self.tally.flush()
        return []


class Metrics:
    """Every metric; `tally` takes the request path's updates (tally.py says why)."""

    def __init__(self, multiprocess_dir: Path | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        self.tally = Tally()
        self.registry = CollectorRegistry()
        r = self.registry
        r.register(_FlushFirst(self.tally))
        self.requests = Counter(
            "grm_requests", "Requests answered, by route, status and replica.",
            ["route", "status", "replica"], registry=r,
        )
        self.latency = Histogram(
            "grm_request_duration_seconds", "Gateway latency of answered requests.",
            ["route"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.inflight = Gauge(
            "grm_requests_in_flight", "Requests being forwarded, by replica (with `serve "
            "--workers N`, each worker's part updated every second).", ["replica"],
            registry=r, multiprocess_mode="livesum",
        )
        self.replica_up = Gauge(
            "grm_replica_up", "1 when the replica is ready to serve.", ["replica"], registry=r,
            multiprocess_mode="livemax",
        )
        self.replica_restarts = Counter(
            "grm_replica_restarts", "Restarts of a replica after a crash.", ["replica"],
            registry=r,
        )
        self.replica_failures = Counter(
            "grm_replica_failures", "Failed attempts at a replica (then failed over).",
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
            ["replica"], registry=r, multiprocess_mode="livemax",
        )
        self.score_items = Counter(
            "grm_score_items", "Scored items, by scorer and status (ok or error): a batch "
            "answered 200 can still hold failed items.", ["scorer", "status"], registry=r,
        )
        self.score_item_latency = Histogram(
            "grm_score_item_duration_seconds", "Time to score one item of a /v1/score batch, "
            "by scorer (every engine call the item needed).", ["scorer"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self._replica_metrics(r)
        self._queue_metrics(r)
        self._ledger_metrics(r)
        self.tokens = Counter(
            "grm_tokens", "Tokens of answered engine requests (the engine's usage), by kind "
            "(prompt or completion).", ["kind"], registry=r,
        )
        self.info = Info("grm_service", "Service identity.", registry=r)
        self.worker_requests: Counter | None = None
        self._own = CollectorRegistry()  # what the multiprocess files cannot carry
        if multiprocess_dir is not None:
            self.worker_requests = Counter(
                "grm_worker_requests", "Requests answered by each worker process of "
                "`serve --workers N` (updated every second).", ["worker"], registry=r,
            )
            self._own.register(self.info)

    def _ledger_metrics(self, r: CollectorRegistry) -> None:
        self.ledger_cache = Counter(
            "grm_ledger_cache", "Cacheable requests, by outcome: hit (answered from the "
            "ledger), coalesced (an identical request in flight), miss.", ["outcome"],
            registry=r,
        )
        self.ledger_written = Counter(
            "grm_ledger_written_records", "Answers written to the ledger.", registry=r,
        )
        self.ledger_dropped = Counter(
            "grm_ledger_dropped_records", "Answers the ledger could not keep (store "
            "unavailable, full disk, buffer full).", registry=r,
        )

    def _replica_metrics(self, r: CollectorRegistry) -> None:
        self.replica_state = Gauge(
            "grm_replica_state", "1 for the state each replica is in (starting, checking, "
            "ready, down, restarting, rejected, stopped), 0 for the others.",
            ["replica", "state"], registry=r, multiprocess_mode="livemax",
        )
        self.replica_error = Gauge(
            "grm_replica_last_error", "1 for the last reason a replica failed to start or went "
            "down (the error label: its first line, and the log's last line where there is one); "
            "0 once a newer reason replaced it.", ["replica", "error"],
            registry=r, multiprocess_mode="livemax",
        )
        self.start_failures = Counter(
            "grm_replica_start_failures", "Starts (or, for an attached replica, probes) that "
            "did not bring the replica up, and admissions it failed.", ["replica"], registry=r,
        )

    def _queue_metrics(self, r: CollectorRegistry) -> None:
        self.queue_depth = Gauge(
            "grm_queue_depth", "Requests waiting for a free slot on their replica.",
            registry=r, multiprocess_mode="livesum",
        )
        self.queue_wait = Histogram(
            "grm_queue_wait_seconds", "Time a request waited for its replica slot (only requests "
            "that found no free slot; the others did not wait).", buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.rejected = Counter(
            "grm_rejected", "Requests refused for load or state (429, 503), by reason: "
            "queue_full (GRM_MAX_QUEUE requests already waited), queue_timeout (no slot "
            "within GRM_QUEUE_TIMEOUT_S), score_backlog (a /v1/score batch past "
            "GRM_SCORE_ITEMS_PER_SLOT), no_replica, draining, starting, connections "
            "(GRM_MAX_CONNECTIONS), bytes_in_flight (GRM_MAX_BYTES_IN_FLIGHT).",
            ["reason"], registry=r,
        )

    def render(self) -> bytes:
        """The exposition text of /metrics: this process's, or every worker's merged."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        self.tally.flush()
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=str(self.multiprocess_dir))  # type: ignore[no-untyped-call]
        return generate_latest(merged) + generate_latest(self._own)

    def answered(self) -> float:
        """Requests this process answered (its own value, in multiprocess mode too)."""
        self.tally.flush()
        return sum(s.value for m in self.requests.collect() for s in m.samples
                   if s.name.endswith("_total"))
