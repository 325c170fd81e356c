"""Forward one request: seed and max_tokens injection, routing, failover, fingerprint wrap."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from prometheus_client import Counter, Gauge

from grm_service import jsonload
from grm_service.canonical import canonical_json, canonical_parts
from grm_service.config import RoutingMode, SerializeMode, Settings
from grm_service.dual_scales import DualScales
from grm_service.engines import Capabilities
from grm_service.errors import (
    BackendFailed,
    BackendRejected,
    GrmError,
    Overloaded,
    ResponseTooLarge,
    ServiceUnavailable,
    StreamingUnsupported,
    UnknownModel,
    UnknownReplica,
)
from grm_service.fingerprint import Fingerprint, parts_digest, system_fingerprint
from grm_service.gateway.request import checkpoint, longstrings, router
from grm_service.gateway.request.answer import Forwarded, Stamps, fingerprint_fields
from grm_service.gateway.request.audit import Auditor
from grm_service.gateway.request.backlog import Backlog, Debt
from grm_service.gateway.request.refusals import Refusals
from grm_service.gateway.request.upstream import Upstream
from grm_service.ledger.book import Ledger
from grm_service.ledger.records import Origin
from grm_service.metrics import Metrics
from grm_service.replicas.identity import ServiceIdentity, always_serialized
from grm_service.replicas.pool import Replica, ReplicaPool

log = logging.getLogger(__name__)


# The canonical JSON of a body, in pieces (`canonical_parts`): hashed and sent as is.
Body = list[bytes | memoryview]

# Inline images above this many base64 characters are checked in a worker thread, so that the
# event loop is never held for more than ~2 ms (the check takes ~0.22-0.28 ms per Mi characters
# on the 2-core benchmark machine: `bench_images.py --check-sizes`). Below it the hop costs more
# CPU than it saves: a 2.7 MB page scan's check cost 0.4-1.4 ms more CPU in a thread than on
# the loop, in five pairs (the bytes pulled into another core's caches, the wake-ups;
# `cpu_inprocess.py --workload scan`).
OFF_LOOP_IMAGE_CHARS = 8 << 20


class _Retryable(Exception):
    """A failure another replica may not have: connection error, timeout, 5xx.

    `str()` is what a client may see (the replica's name and what went wrong); `detail` (with
    addresses and library reprs) goes to the log only.
    """

    def __init__(self, reason: str, replica: str, summary: str, detail: str = "") -> None:
        super().__init__(f"{replica}: {summary}")
        self.reason = reason
        self.detail = detail or summary


# grm_tokens_total's kinds, by the usage keys of chat and of the Responses API.
_USAGE = (("prompt", "prompt_tokens"), ("completion", "completion_tokens"),
          ("prompt", "input_tokens"), ("completion", "output_tokens"))


@dataclass(frozen=True, slots=True)
class PathSettings:
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
    def of(cls, settings: Settings) -> PathSettings:
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


@dataclass
class Gateway:
    """Everything a request needs, built once by the app's lifespan. `identity` is the
    process's one holder of the service's reference identity (replicas/identity.py)."""

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
    # The process's one count of refusals (`Service`'s, shared with the edge); a Gateway built
    # alone makes its own.
    refusals: Refusals | None = None
    # The served dual encoder's logit_scale/logit_bias, read from its checkpoint at start-up
    # (`dual_scales.py`): the `clip` scorer's; None where the model is none or not on this host.
    scales: DualScales | None = None
    queued: int = 0
    batches: int = 0  # score batches admitted and not yet answered (`batch`)
    limits: checkpoint.Limits = field(init=False)
    path_settings: PathSettings = field(init=False)
    backlog: Backlog = field(init=False)

    # Per-replica gauge children: `labels()` costs a lock and a tuple build per call.
    _gauges: dict[str, Gauge] = field(default_factory=dict, repr=False)
    _tokens: dict[str, Counter] = field(default_factory=dict, repr=False)
    stamps: Stamps = field(default_factory=Stamps, repr=False)

    def __post_init__(self) -> None:
        self.limits = checkpoint.Limits.from_settings(self.settings)
        self.path_settings = PathSettings.of(self.settings)
        self.backlog = Backlog(self.settings.score_items_per_slot)
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
        alone = always_serialized(self.identity.capabilities, self.path_settings.serialize)
        bound = self.path_settings.max_inflight_per_replica
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


# The fields that bound an answer's length, the first of them filled in where none is set.
CHAT_TOKENS = ("max_tokens", "max_completion_tokens")
RESPONSES_TOKENS = ("max_output_tokens",)


def prepare(body: dict[str, Any], settings: PathSettings,
            tokens: tuple[str, ...] = CHAT_TOKENS) -> dict[str, Any]:
    """The body the replica will see: client values kept, seed/max_tokens/model filled in
    (`tokens`: the path's length fields, `RESPONSES_TOKENS` for the Responses API)."""
    if body.get("stream"):
        raise StreamingUnsupported(
            "stream=true is not supported: a fingerprint covers the whole response; "
            "send stream=false (or omit it)"
        )
    prepared = dict(body)
    prepared.pop("stream", None)
    model = prepared.setdefault("model", settings.model_name)
    if model != settings.model_name:
        raise UnknownModel(f"model {model!r} is not served here; use {settings.model_name!r}")
    if prepared.get("seed") is None:
        prepared["seed"] = settings.seed
    for name in tokens:  # a loop, not all(...): no generator per request
        if prepared.get(name) is not None:
            break
    else:
        prepared[tokens[0]] = settings.max_tokens_default
    return prepared


def _truncates_sampling(body: dict[str, Any]) -> bool:
    if body.get("temperature") == 0:
        return False  # greedy: no nucleus edge to disagree on
    # A missing top_p may still be set below 1 by the model's generation config.
    top_p = body.get("top_p")
    top_k = body.get("top_k")
    return top_p is None or top_p < 1 or (top_k is not None and top_k > 0)


# Enum members the request path compares with, read once: an attribute read on an Enum class
# goes through its metaclass's `__getattr__` hook in Python 3.11 (~0.7 k instructions).
_ON, _AUTO, _LEAST_LOADED = SerializeMode.ON, SerializeMode.AUTO, RoutingMode.LEAST_LOADED


# Pooling runs alone on a replica unless the engine profile declares it batch-invariant (an
# engine version where that was measured) and the replica's pooling canary proved it.
POOLING_PATHS = frozenset({"/classify", "/pooling", "/v1/embeddings"})


def pooling_alone(replica: Replica, caps: Capabilities, mode: SerializeMode) -> bool:
    if mode is _ON:
        return True
    return not (caps.pooling_invariant and replica.pooling_batched)


def runs_alone(replica: Replica, pooling: bool, alone: bool, caps: Capabilities,
               mode: SerializeMode) -> bool:
    """Whether this request runs alone on `replica`: `alone` (`must_run_alone` of a generative
    body), a replica the live audit serialized, or pooling not proven there."""
    return alone or replica.serialized or (pooling and pooling_alone(replica, caps, mode))


def must_run_alone(body: dict[str, Any], caps: Capabilities, mode: SerializeMode) -> bool:
    if mode is not _AUTO:
        return mode is _ON
    if not caps.batch_invariant:
        return True
    return not caps.sampling_invariant and _truncates_sampling(body)


def route(gw: Gateway, key: int, pin: str | None = None) -> list[Replica]:
    if pin is not None:
        return _pinned(gw, pin)
    now = time.monotonic()
    up = gw.pool.ready()
    # With every breaker open, trying a tripped replica beats refusing outright.
    ready = {r.name: r for r in ([r for r in up if not r.breaker_open(now)] or up)}
    if gw.path_settings.routing is _LEAST_LOADED:
        names = router.least_loaded_order(key, list(ready), lambda n: ready[n].gate.inflight)
    else:
        names = router.rendezvous_order(key, list(ready))
    return [ready[n] for n in names]


def looked_again(gw: Gateway, key: int, pin: str | None = None) -> list[Replica]:
    """Where `route` found no ready replica: the replica set looked at again (`Gateway.look`)
    and routed over, else the refusal. A quiet worker's view lags the keeper's by up to its
    follower's interval, where a replica that came back is already ready in the other workers'
    (and in the /ready they answer)."""
    if gw.look is not None:
        gw.look()
        if order := route(gw, key, pin):
            return order
    raise gw.refused("no_replica", ServiceUnavailable(
        f"no healthy replica ({_states(gw.pool)}): retry later; GET /ready shows each "
        "replica's state, the gateway's log why one is not ready", retry_after=5))


def _states(pool: ReplicaPool) -> str:
    if not pool.replicas:
        return "none configured"
    shown = ", ".join(f"{r.name} {r.state.value}" for r in pool.replicas[:8])
    return shown + (", ..." if len(pool.replicas) > 8 else "")


def _pinned(gw: Gateway, pin: str) -> list[Replica]:
    replica = gw.pool.by_name(pin)
    if replica is None:
        known = ", ".join(r.name for r in gw.pool.replicas)
        raise UnknownReplica(f"x-grm-pin-replica {pin[:40]!r} names no replica; "
                             f"replicas: {known}")
    return [replica] if replica.ready else []


async def _admit(gw: Gateway, replica: Replica, alone: bool, owed: bool = False) -> None:
    """Wait for a slot on the replica, within the queue's size and time bounds; `owed`: an
    item of an admitted score batch (`Gateway.owe`), which waits as long as it takes."""
    settings = gw.path_settings
    if gw.queued >= settings.max_queue and not owed:
        raise gw.refused("queue_full", Overloaded(
            f"{gw.queued} requests already wait for a replica slot, the limit "
            f"(GRM_MAX_QUEUE={settings.max_queue}): retry later; raise GRM_MAX_QUEUE or add "
            "replicas", retry_after=1))
    if replica.gate.try_acquire(alone, settings.max_inflight_per_replica):
        return  # a free slot and nobody ahead: no queue entry, no timer
    metrics = gw.metrics
    gw.queued += 1
    metrics.queue_depth.inc()
    started = time.monotonic()
    try:
        async with asyncio.timeout(None if owed else settings.queue_timeout_s):
            await replica.gate.acquire(alone, settings.max_inflight_per_replica)
    except TimeoutError:
        raise gw.refused("queue_timeout", Overloaded(
            f"no slot on replica {replica.name} within GRM_QUEUE_TIMEOUT_S="
            f"{settings.queue_timeout_s:g} s (it serves "
            f"{'one request at a time' if alone else settings.max_inflight_per_replica}): "
            "retry later; raise GRM_QUEUE_TIMEOUT_S or add replicas; a /v1/score batch's "
            "items are never refused this way", retry_after=1)) from None
    finally:
        gw.queued -= 1
        metrics.queue_depth.dec()
        metrics.queue_wait.observe(time.monotonic() - started)
    if not replica.ready:
        # It went down while this request waited for its slot: fail over now.
        await replica.gate.release(alone)
        raise _Retryable("down", replica.name, "went down while the request waited")


async def _post(gw: Gateway, replica: Replica, path: str, raw: Body) -> tuple[int, bytes]:
    gauge, tally = gw.inflight_gauge(replica.name), gw.metrics.tally
    tally.add(gauge, 1)
    try:
        return await gw.client.post(replica.url, path, *raw)
    except TimeoutError as err:
        raise _Retryable("timeout", replica.name, "timed out") from err
    except ResponseTooLarge as err:  # not retried: every replica would answer the same
        raise ResponseTooLarge(f"{replica.name}: {err.message}") from None
    except OSError as err:  # refused, reset, closed early, not HTTP (ConnectionError is one)
        raise _Retryable("connection", replica.name, "connection failed",
                         f"{type(err).__name__} to {replica.url}: {err}") from err
    finally:
        tally.add(gauge, -1)


async def _attempt(
    gw: Gateway, replica: Replica, path: str, raw: Body, alone: bool, owed: bool = False
) -> tuple[dict[str, Any], bytes]:
    await _admit(gw, replica, alone, owed)
    try:
        response = await _post(gw, replica, path, raw)
    finally:
        await replica.gate.release(alone)
    return _decode(replica, response)


def _decode(replica: Replica, response: tuple[int, bytes]) -> tuple[dict[str, Any], bytes]:
    """The engine's payload, and its bytes where they are strict JSON of it (else b"")."""
    status, content = response
    if status >= 500:
        raise _Retryable("status", replica.name, f"HTTP {status}")
    try:
        payload, strict = jsonload.loads_strict(content)
    except ValueError as err:
        if status >= 400:  # a plain-text 4xx (e.g. 404 of a missing route)
            text = content.decode(errors="replace")[:500]
            raise BackendRejected(f"engine: {text}", status) from None
        raise _Retryable("decode", replica.name, "response is not JSON") from err
    if status >= 400:
        raise BackendRejected(_engine_message(payload), status)
    if not isinstance(payload, dict):
        raise _Retryable("decode", replica.name, "response is not a JSON object")
    return payload, content if strict else b""


def _engine_message(payload: Any) -> str:
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return f"engine: {error['message']}"
    if isinstance(payload, dict) and payload.get("message"):
        return f"engine: {payload['message']}"
    return f"engine rejected the request: {json.dumps(payload)[:500]}"


async def forward(
    gw: Gateway, path: str, body: dict[str, Any], pin: str | None = None, audit: bool = True,
    lifted: longstrings.Lifted | None = None, origin: Origin | None = None,
    admitted: bool = False,
) -> Forwarded:
    """Check a prepared body, send it to its replica, fail over along the rendezvous order.
    `lifted`: the body's long strings as the client sent them (`longstrings.loads`). With an
    `origin` (a client's request, not an audit's) the answer goes through the ledger.
    `admitted`: an item of a batch admitted before the drain (`Gateway.batch`) and owed
    service (`Gateway.owe`): never refused for the drain or for queue time."""
    if not admitted:
        gw.refuse_if_draining()
    inline = await check(gw, path, body, lifted)
    # Once: the routing key and the request digest share it. Inline images are long strings.
    raw: Body = (canonical_parts(body, lifted) if inline
                 else [canonical_json(body)])
    ledger = gw.ledger
    if ledger is None or origin is None:
        return await _send(gw, path, body, raw, pin, audit, owed=admitted)
    if not ledger.may_answer(origin, pinned=pin is not None):
        forwarded = await _send(gw, path, body, raw, pin, audit, owed=admitted)
        ledger.record(path, raw, origin, forwarded)
        return forwarded
    request = parts_digest(raw)  # the cache's key and the fingerprint's: hashed once
    forwarded, how = await ledger.answer(
        path, raw, request, origin, functools.partial(_expected_id, gw, body),
        lambda: _send(gw, path, body, raw, pin, audit, request, admitted),
        functools.partial(served, gw))
    if how == "hit" and audit and gw.auditor is not None and gw.auditor.draw():
        _audit(gw, gw.auditor, path, body, None, forwarded)
    return forwarded


def served(gw: Gateway, payload: dict[str, Any], fields: dict[str, Any]) -> Forwarded:
    """A recorded answer served again (`fields` marked by the ledger): rendered whole."""
    return Forwarded(payload, fields, _system_of(gw, fields))


def _system_of(gw: Gateway, fields: dict[str, Any]) -> str:
    """The seed-free `system_fingerprint` of the identity that computed a recorded answer: the
    service's own where the fingerprint ids agree (the ledger keys answers by it), else what a
    verified answer's fields prove."""
    ref = gw.identity.reference
    if ref is not None and ref.fingerprint_id(fields["seed"]) == fields["fingerprint_id"]:
        return ref.system_fingerprint()
    if fields.get("model_hash") and fields.get("env_digest"):
        return system_fingerprint(fields["model_hash"], fields["env_digest"])
    return "grm-unverified-sys-unknown"


def _expected_id(gw: Gateway, body: dict[str, Any]) -> str | None:
    """The fingerprint id the service's replicas would stamp on this body's answer."""
    reference = gw.identity.reference
    if reference is None:
        return None
    seed = body.get("seed")
    return reference.fingerprint_id(gw.path_settings.seed if seed is None else seed)


async def _send(gw: Gateway, path: str, body: dict[str, Any], raw: Body, pin: str | None,
                audit: bool, request_digest: str | None = None, owed: bool = False
                ) -> Forwarded:
    """`request_digest`: `raw`'s, where the caller has it (else hashed for the answer);
    `owed`: an admitted score item (`_admit`)."""
    key = router.key_of_parts(raw)
    order = route(gw, key, pin) or looked_again(gw, key, pin)
    caps, mode = gw.identity.capabilities, gw.path_settings.serialize
    pooling = path in POOLING_PATHS
    alone = not pooling and must_run_alone(body, caps, mode)
    errors = []
    for replica in order[: gw.path_settings.max_attempts]:
        serialized = runs_alone(replica, pooling, alone, caps, mode)
        try:
            payload, engine_json = await _attempt(gw, replica, path, raw, serialized, owed)
        except _Retryable as err:
            gw.metrics.backend_failures.labels(replica=replica.name, reason=err.reason).inc()
            log.warning("attempt failed, failing over: %s (%s)", err, err.detail)
            errors.append(str(err))
            _record(gw, replica, ok=False)
            continue
        _record(gw, replica, ok=True)
        gw.count_tokens(payload)
        forwarded = _answer(gw, replica, body, request_digest or parts_digest(raw), payload,
                            serialized, engine_json)
        if audit and gw.auditor is not None and gw.auditor.draw():
            _audit(gw, gw.auditor, path, body, replica, forwarded)
        return forwarded
    raise BackendFailed("every attempt failed: " + "; ".join(errors), retry_after=1)


def _audit(gw: Gateway, auditor: Auditor, path: str, body: dict[str, Any],
           replica: Replica | None, forwarded: Forwarded) -> None:
    """Re-run on another replica of the same identity; `replica` None: a ledger hit, re-run on
    any replica of the service's identity (a cache that went wrong is caught the same way)."""
    # Only replicas claiming the same identity can be held to the same bits.
    ident = replica.identity if replica is not None else gw.identity.reference
    others = [r.name for r in gw.pool.ready()
              if (replica is None or r.name != replica.name) and r.identity == ident]
    other = auditor.choose(others)
    if other is not None:
        auditor.start(path, body, forwarded.fingerprint, other, functools.partial(_rerun, gw))


async def check(gw: Gateway, path: str, body: dict[str, Any],
                lifted: longstrings.Lifted | None = None) -> list[str]:
    """`checkpoint.check_body`, with large inline images decoded off the event loop; returns
    the inline images' data URLs."""
    inline = checkpoint.scan(path, body, gw.limits)
    if not inline:
        return inline
    if sum(len(url) for url in inline) > OFF_LOOP_IMAGE_CHARS:
        await asyncio.to_thread(checkpoint.check_images, inline, gw.limits, lifted)
    else:
        checkpoint.check_images(inline, gw.limits, lifted)
    return inline


def _record(gw: Gateway, replica: Replica, ok: bool) -> None:
    settings = gw.path_settings
    opened = replica.record(ok, time.monotonic(), settings.breaker_failures,
                            settings.breaker_cooldown_s)
    if opened:
        log.error("breaker open for %s after %d failures: no traffic for %.0f s", replica.name,
                  replica.failures, settings.breaker_cooldown_s)


async def _rerun(gw: Gateway, path: str, body: dict[str, Any], pin: str) -> Fingerprint:
    return (await forward(gw, path, body, pin, audit=False)).fingerprint


def _answer(gw: Gateway, replica: Replica, body: dict[str, Any], request_digest: str,
            payload: dict[str, Any], alone: bool, engine_json: bytes) -> Forwarded:
    ident = replica.identity
    assert ident is not None, "admission reads the identity before a replica is routed to"
    # The checkpoint let through only an integer seed or none; none means the service seed.
    seed = body.get("seed")
    stamp = gw.stamps.get(replica.name, ident, gw.path_settings.seed if seed is None else seed)
    # Strict bytes (`engine_json`) are the ones msgspec's decoder parsed (`_decode`).
    fields = fingerprint_fields(stamp, alone, request_digest, payload, decoded=bool(engine_json))
    return Forwarded(payload, fields, stamp.system, stamp.json, engine_json, stamp.headers)
