"""Forward one request: the checkpoint, the seed, routing, failover, the ledger, the fingerprint.

    fc = ForwardContext(settings, pool, client, metrics, identity, ...)   # the lifespan, once
    body = prepare(client_body, fc.request_settings)                      # a sampling route's
    forwarded = await forward(fc, path, body, pin, origin=asker)          # every path's
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from grm_service.canonical import canonical_body, canonical_parts
from grm_service.config import RoutingMode
from grm_service.errors import ReplicaFailed, ServiceUnavailable, StreamingUnsupported, UnknownModel
from grm_service.fingerprint import Fingerprint, parts_digest, system_fingerprint
from grm_service.gateway.request import checkpoint, longstrings, router
from grm_service.gateway.request.alone import must_run_alone, runs_alone
from grm_service.gateway.request.answer import Forwarded, fingerprint_fields
from grm_service.gateway.request.audit import Auditor
from grm_service.gateway.request.context import POOLING_PATHS, ForwardContext, RequestSettings
from grm_service.gateway.request.exchange import Body, Retryable, attempt
from grm_service.ledger.book import Ledger
from grm_service.ledger.records import Origin
from grm_service.replicas.pool import Replica

log = logging.getLogger(__name__)

# Inline images above this many base64 characters are checked in a worker thread, so that the
# event loop is never held for more than ~2 ms (the check takes ~0.22-0.28 ms per Mi characters
# on the 2-core benchmark machine: `bench_images.py --check-sizes`). Below it the hop costs more
# CPU than it saves: a 2.7 MB page scan's check cost 0.4-1.4 ms more CPU in a thread than on
# the loop, in five pairs (the bytes pulled into another core's caches, the wake-ups;
# `cpu_inprocess.py --workload scan`).
OFF_LOOP_IMAGE_CHARS = 8 << 20


# The fields that bound an answer's length, the first of them filled in where none is set.
CHAT_TOKENS = ("max_tokens", "max_completion_tokens")
RESPONSES_TOKENS = ("max_output_tokens",)


# An Enum member compared with per request, read once: an attribute read on an Enum class goes
# through its metaclass's `__getattr__` hook in Python 3.11 (~0.7 k instructions).
_LEAST_LOADED = RoutingMode.LEAST_LOADED


def prepare(body: dict[str, Any], settings: RequestSettings,
            tokens: tuple[str, ...] = CHAT_TOKENS) -> dict[str, Any]:
    """The sampling body the replica will see: client values kept, max_tokens and model filled
    in (`tokens`: the path's length fields, `RESPONSES_TOKENS` for the Responses API). The
    seed is `forward`'s to decide, for every path alike (`RequestSettings.seeded`)."""
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
    for name in tokens:  # a loop, not all(...): no generator per request
        if prepared.get(name) is not None:
            break
    else:
        prepared[tokens[0]] = settings.max_tokens_default
    return prepared


async def forward(
    fc: ForwardContext, path: str, body: dict[str, Any], pin: str | None = None,
    audit: bool = True, lifted: longstrings.Lifted | None = None, origin: Origin | None = None,
    admitted: bool = False,
) -> Forwarded:
    """Check a prepared body, seed it, send it to its replica, fail over along the rendezvous
    order. `lifted`: the body's long strings as the client sent them (`longstrings.loads`).
    With an `origin` (a client's request, not an audit's) the answer goes through the ledger.
    `admitted`: an item of a batch admitted before the drain (`ForwardContext.batch`) and owed
    service (`ForwardContext.owe`): never refused for the drain or for queue time."""
    if not admitted:
        fc.refuse_if_draining()
    inline = await check(fc, path, body, lifted)
    seed = fc.request_settings.seeded(path, body)
    # Once: the route digest and the request digest share it. Inline images are long strings.
    raw: Body = canonical_parts(body, lifted) if inline else [canonical_body(body)]
    sending = _Sending(path, body, raw, seed, pin, audit, admitted)
    ledger = fc.ledger
    if ledger is None or origin is None:
        return await _send(fc, sending)
    if not ledger.may_answer(origin, pinned=pin is not None):
        forwarded = await _send(fc, sending)
        ledger.record(path, raw, origin, forwarded)
        return forwarded
    return await _through_cache(fc, ledger, sending, origin)


class _Sending:
    """One checked, seeded body on its way, as `forward` hands it down."""

    __slots__ = ("audit", "body", "digest", "owed", "path", "pin", "raw", "seed")

    def __init__(self, path: str, body: dict[str, Any], raw: Body, seed: int, pin: str | None,
                 audit: bool, owed: bool) -> None:
        self.path, self.body, self.raw, self.seed = path, body, raw, seed
        self.pin, self.audit, self.owed = pin, audit, owed
        self.digest: str | None = None  # `raw`'s, once hashed


async def _through_cache(fc: ForwardContext, ledger: Ledger, sending: _Sending,
                         origin: Origin) -> Forwarded:
    """A request the ledger's cache may answer: looked up, else computed with identical ones
    waiting for it; recorded either way."""
    path, raw = sending.path, sending.raw
    sending.digest = parts_digest(raw)  # the cache's lookup and the fingerprint's: hashed once
    scope = ledger.scope(origin)
    expected = _expected_id(fc, sending.seed)
    if expected is None:  # no replica's identity known yet: nothing to look it up by
        forwarded = await _send(fc, sending)
        ledger.record(path, raw, origin, forwarded, "", scope)
        return forwarded
    lookup = ledger.lookup_of(path, sending.digest, origin, expected)
    found = await ledger.look_up(lookup)
    if found is None:
        with ledger.lead(lookup) as lead:
            forwarded = await _send(fc, sending)
            lead.done(forwarded)
        ledger.record(path, raw, origin, forwarded, "", scope)
        return forwarded
    forwarded = served(fc, *found)
    how = found[1]["cache"]
    ledger.record(path, raw, origin, forwarded, how, scope)
    if how == "hit" and sending.audit and fc.auditor is not None and fc.auditor.draw():
        _audit(fc, fc.auditor, path, sending.body, None, forwarded)
    return forwarded


def served(fc: ForwardContext, payload: dict[str, Any], fields: dict[str, Any]) -> Forwarded:
    """A recorded answer served again (`fields` marked by the ledger): rendered whole."""
    return Forwarded(payload, fields, _system_of(fc, fields))


def _system_of(fc: ForwardContext, fields: dict[str, Any]) -> str:
    """The seed-free `system_fingerprint` of the identity that computed a recorded answer: the
    service's own where the fingerprint ids agree (the ledger keys answers by it), else what a
    verified answer's fields prove."""
    ref = fc.identity.reference
    if ref is not None and ref.fingerprint_id(fields["seed"]) == fields["fingerprint_id"]:
        return ref.system_fingerprint()
    if fields.get("model_hash") and fields.get("env_digest"):
        return system_fingerprint(fields["model_hash"], fields["env_digest"])
    return "grm-unverified-sys-unknown"


def _expected_id(fc: ForwardContext, seed: int) -> str | None:
    """The fingerprint id the service's replicas would stamp on an answer seeded `seed`."""
    reference = fc.identity.reference
    return None if reference is None else reference.fingerprint_id(seed)


def _order(fc: ForwardContext, digest: int, pin: str | None) -> list[Replica]:
    """The replicas to try, best first; refused where none is ready, even looked at again."""
    least_loaded = fc.request_settings.routing is _LEAST_LOADED
    order = (router.route(fc.pool, digest, least_loaded, pin)
             or router.looked_again(fc.pool, fc.look, digest, least_loaded, pin))
    if not order:
        raise fc.refused("no_replica", ServiceUnavailable(
            f"no healthy replica ({router.states(fc.pool)}): retry later; GET /ready shows "
            "each replica's state, the gateway's log why one is not ready", retry_after=5))
    return order


async def _send(fc: ForwardContext, sending: _Sending) -> Forwarded:
    """Along the replicas' order until one answers (`max_attempts` of them at most)."""
    path, body, raw = sending.path, sending.body, sending.raw
    order = _order(fc, router.route_digest_of_parts(raw), sending.pin)
    caps, mode = fc.identity.capabilities, fc.request_settings.serialize
    pooling = path in POOLING_PATHS
    alone = not pooling and must_run_alone(body, caps, mode)
    errors = []
    for replica in order[: fc.request_settings.max_attempts]:
        serialized = runs_alone(replica, pooling, alone, caps, mode)
        try:
            payload, engine_json = await attempt(fc, replica, path, raw, serialized,
                                                 sending.owed)
        except Retryable as err:
            fc.metrics.replica_failures.labels(replica=replica.name, reason=err.reason).inc()
            log.warning("attempt failed, failing over: %s (%s)", err, err.detail)
            errors.append(str(err))
            _record(fc, replica, ok=False)
            continue
        _record(fc, replica, ok=True)
        fc.meters.count_tokens(payload)
        forwarded = _answer(fc, replica, sending, payload, serialized, engine_json)
        if sending.audit and fc.auditor is not None and fc.auditor.draw():
            _audit(fc, fc.auditor, path, body, replica, forwarded)
        return forwarded
    raise ReplicaFailed("every attempt failed: " + "; ".join(errors), retry_after=1)


def _audit(fc: ForwardContext, auditor: Auditor, path: str, body: dict[str, Any],
           replica: Replica | None, forwarded: Forwarded) -> None:
    """Re-run on another replica of the same identity; `replica` None: a ledger hit, re-run on
    any replica of the service's identity (a cache that went wrong is caught the same way)."""
    # Only replicas claiming the same identity can be held to the same bits.
    ident = replica.identity if replica is not None else fc.identity.reference
    others = [r.name for r in fc.pool.ready()
              if (replica is None or r.name != replica.name) and r.identity == ident]
    other = auditor.choose(others)
    if other is not None:
        auditor.start(path, body, forwarded.fingerprint, other, functools.partial(_rerun, fc))


async def check(fc: ForwardContext, path: str, body: dict[str, Any],
                lifted: longstrings.Lifted | None = None) -> list[str]:
    """`checkpoint.check_body`, with large inline images decoded off the event loop; returns
    the inline images' data URLs."""
    inline = checkpoint.scan(path, body, fc.limits)
    if not inline:
        return inline
    if sum(len(url) for url in inline) > OFF_LOOP_IMAGE_CHARS:
        await asyncio.to_thread(checkpoint.check_images, inline, fc.limits, lifted)
    else:
        checkpoint.check_images(inline, fc.limits, lifted)
    return inline


def _record(fc: ForwardContext, replica: Replica, ok: bool) -> None:
    settings = fc.request_settings
    opened = replica.record(ok, time.monotonic(), settings.breaker_failures,
                            settings.breaker_cooldown_s)
    if opened:
        log.error("breaker open for %s after %d failures: no traffic for %.0f s", replica.name,
                  replica.failures, settings.breaker_cooldown_s)


async def _rerun(fc: ForwardContext, path: str, body: dict[str, Any], pin: str) -> Fingerprint:
    return (await forward(fc, path, body, pin, audit=False)).fingerprint


def _answer(fc: ForwardContext, replica: Replica, sending: _Sending, payload: dict[str, Any],
            alone: bool, engine_json: bytes) -> Forwarded:
    ident = replica.identity
    assert ident is not None, "admission reads the identity before a replica is routed to"
    stamp = fc.stamps.get(replica.name, ident, sending.seed)
    digest = sending.digest or parts_digest(sending.raw)
    # Strict bytes (`engine_json`) are the ones msgspec's decoder parsed (`exchange._decode`).
    fields = fingerprint_fields(stamp, alone, digest, payload, decoded=bool(engine_json))
    return Forwarded(payload, fields, stamp.system, stamp.json, engine_json, stamp.headers)
