"""What a request is forwarded with: the process's `ForwardContext`, built once by the app's
lifespan, and the `RequestSettings` every request reads."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from prometheus_client import Counter, Gauge

from grm_service.config import RoutingMode, SerializeMode, Settings
from grm_service.dual_scales import DualScales
from grm_service.errors import GrmError, Overloaded, ServiceUnavailable
from grm_service.gateway.request import checkpoint
from grm_service.gateway.request.answer import Stamps
from grm_service.gateway.request.audit import Auditor
from grm_service.gateway.request.backlog import Backlog, Debt
from grm_service.gateway.request.refusals import Refusals
from grm_service.gateway.request.upstream import Upstream
from grm_service.ledger.book import Ledger
from grm_service.metrics import Metrics
from grm_service.replicas.identity import ServiceIdentity, always_serialized
from grm_service.replicas.pool import ReplicaPool

# The engine paths that pool (nothing is sampled): they take no seed and no max_tokens.
POOLING_PATHS = frozenset({"/classify", "/pooling", "/v1/embeddings"})

# grm_tokens_total's kinds, by the usage keys of chat and of the Responses API.
_USAGE = (("prompt", "prompt_tokens"), ("completion", "completion_tokens"),
          ("prompt", "input_tokens"), ("completion", "output_tokens"))


@dataclass(frozen=True, slots=True)
class RequestSettings:
    """The settings every request reads, as plain attributes: each attribute read on a pydantic
    model goes through its `__getattr__` hook (~0.7 k instructions; a chat request made ~13)."""

    model_name: str
    seed: int
    max_tokens_default: int
    routing: RoutingMode
    serialize: SerializeMode
    max_queue: int
    max_inflight_per_replica: int
    queue_timeout_s: float
    max_attempts: int
    breaker_failures: int
    breaker_cooldown_s: float

    @classmethod
    def of(cls, settings: Settings) -> RequestSettings:
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})

    def seeded(self, path: str, body: dict[str, Any]) -> int:
        """The one decision of a request's seed: the client's, else the service's. A sampling
        body gets it written in (the replica samples with it); a pooling body does not (vLLM's
        pooling routes take none), and its fingerprint still names the seed it was given."""
        seed = body.get("seed")
        if seed is None:
            seed = self.seed
            if path not in POOLING_PATHS:
                body["seed"] = seed
        return int(seed)


class ReplicaMeters:
    """The per-replica and per-kind children of the metrics the request path bumps, made once:
    `labels()` costs a lock and a tuple build per call."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._gauges: dict[str, Gauge] = {}
        self._tokens: dict[str, Counter] = {}

    def count_tokens(self, payload: dict[str, Any]) -> None:
        """grm_tokens_total from the engine's `usage` (absent on some routes: nothing then)."""
        usage = payload.get("usage")
        if not isinstance(usage, dict):
            return
        for kind, key in _USAGE:
            count = usage.get(key)
            if isinstance(count, int) and count > 0:
                counter = self._tokens.get(kind)
                if counter is None:
                    counter = self._tokens[kind] = self.metrics.tokens.labels(kind=kind)
                self.metrics.tally.add(counter, count)

    def inflight_gauge(self, replica: str) -> Gauge:
        gauge = self._gauges.get(replica)
        if gauge is None:
            gauge = self._gauges[replica] = self.metrics.inflight.labels(replica=replica)
        return gauge


@dataclass
class ForwardContext:
    """The per-process bundle a request is forwarded with (`proxy.forward`), built once by the
    app's lifespan. `identity` is the process's one holder of the service's reference identity
    (replicas/identity.py)."""

    settings: Settings
    pool: ReplicaPool
    client: Upstream
    metrics: Metrics
    identity: ServiceIdentity
    auditor: Auditor | None = None
    ledger: Ledger | None = None
    draining: bool = False
    # A fresh look at the replica set before a request is refused for want of a ready replica
    # (a worker's follower: its view lags the keeper's by its interval); None where the keeper
    # is in this process and its pool is the set itself.
    look: Callable[[], object] | None = None
    # The process's one count of refusals (`Service`'s, shared with the edge); a context built
    # alone makes its own.
    refusals: Refusals | None = None
    # The served dual encoder's logit_scale/logit_bias, read from its checkpoint at start-up
    # (`dual_scales.py`): the `clip` scorer's; None where the model is none or not on this host.
    scales: DualScales | None = None
    queued: int = 0
    batches: int = 0  # score batches admitted and not yet answered (`batch`)
    limits: checkpoint.Limits = field(init=False)
    request_settings: RequestSettings = field(init=False)
    backlog: Backlog = field(init=False)
    meters: ReplicaMeters = field(init=False, repr=False)
    stamps: Stamps = field(default_factory=Stamps, repr=False)

    def __post_init__(self) -> None:
        self.limits = checkpoint.Limits.from_settings(self.settings)
        self.request_settings = RequestSettings.of(self.settings)
        self.backlog = Backlog(self.settings.score_items_per_slot)
        self.meters = ReplicaMeters(self.metrics)
        if self.refusals is None:
            self.refusals = Refusals(self.metrics.rejected)

    @property
    def inflight(self) -> int:
        return self.batches + self.queued + sum(r.gate.inflight for r in self.pool.replicas)

    def refused(self, reason: str, err: GrmError) -> GrmError:
        """`err` counted and logged (rate-limited) under `reason`, to be raised."""
        assert self.refusals is not None, "set by __post_init__"
        return self.refusals.refuse(reason, err)

    def refuse_if_draining(self) -> None:
        """New work after the drain has begun: 503, Retry-After 5 s."""
        if self.draining:
            raise self.refused("draining", ServiceUnavailable(
                "the service is shutting down (SIGTERM; work in flight gets "
                f"GRM_DRAIN_TIMEOUT_S={self.settings.drain_timeout_s:g} s): retry against "
                "another instance, or once it is back", retry_after=5))

    def slots(self) -> int:
        """Requests the ready replicas serve at once (`backlog.py`)."""
        alone = always_serialized(self.identity.capabilities, self.request_settings.serialize)
        bound = self.request_settings.max_inflight_per_replica
        return sum(1 if alone or r.serialized else bound for r in self.pool.ready())

    @contextlib.contextmanager
    def owe(self, items: int) -> Iterator[Debt]:
        """A score batch of `items`, admitted (`backlog.py`) or refused with 429 before any of
        its items runs; its items then wait for their slots as long as it takes."""
        try:
            self.backlog.check(items, self.slots())
        except Overloaded as err:
            raise self.refused("score_backlog", err) from None
        with self.backlog.owe(items) as debt:
            yield debt

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """A batch of engine requests (`/v1/score`), from its start to its answer: refused
        once the drain has begun, and after that counted in `inflight`, so that the drain
        waits for all of its items, and its items' engine requests are never refused
        (`forward(admitted=True)`): a batch begun before a stop is answered whole."""
        self.refuse_if_draining()
        self.batches += 1
        try:
            yield
        finally:
            self.batches -= 1
