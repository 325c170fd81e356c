"""One attempt on one replica: a slot within the queue's bounds, the POST, the decoded answer.
A failure another replica may not have raises `Retryable`, for `proxy` to fail over."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from grm_service import jsonload
from grm_service.errors import Overloaded, ReplicaRejected, ResponseTooLarge
from grm_service.gateway.request.context import ForwardContext
from grm_service.replicas.pool import Replica

# The canonical JSON of a body, in pieces (`canonical_parts`): hashed and sent as is.
Body = list[bytes | memoryview]


# 4xx answers about the replica's door, not the body: a proxy or an auth layer in front of one
# replica (an ingress's 429 or 408, a replica's own --api-key refusing the gateway's credentials).
# Passed on, they would tell the client to slow down or fix a key that is not its own; another
# replica may well take the same body.
_NOT_ABOUT_THE_BODY = {
    401: "refused the gateway's credentials: GRM_REPLICA_API_KEY",
    403: "refused the gateway's credentials: GRM_REPLICA_API_KEY",
    407: "its proxy wants credentials",
    408: "timed out reading the request",
    429: "too many requests",
}


class Retryable(Exception):
    """A failure another replica may not have: connection error, timeout, 5xx, or a 4xx about
    the replica's door rather than the body (`_NOT_ABOUT_THE_BODY`).

    `str()` is what a client may see (the replica's name and what went wrong); `detail` (with
    addresses and library reprs) goes to the log only.
    """

    def __init__(self, reason: str, replica: str, summary: str, detail: str = "") -> None:
        super().__init__(f"{replica}: {summary}")
        self.reason = reason
        self.detail = detail or summary


async def attempt(
    fc: ForwardContext, replica: Replica, path: str, raw: Body, alone: bool, owed: bool = False
) -> tuple[dict[str, Any], bytes]:
    """The replica's payload for `raw`, and its bytes where they are strict JSON of it."""
    if not _slot_now(fc, replica, alone, owed):  # a free slot costs no coroutine
        await _wait_for_slot(fc, replica, alone, owed)
    try:
        response = await _post(fc, replica, path, raw)
    finally:
        await replica.gate.release(alone)
    return _decode(replica, response)


def _slot_now(fc: ForwardContext, replica: Replica, alone: bool, owed: bool) -> bool:
    """A slot on the replica taken at once: one is free and nobody waits ahead (no queue entry,
    no timer, no coroutine). Refused where the queue is full; `owed`: an item of an admitted
    score batch (`ForwardContext.owe`), never refused for it."""
    settings = fc.request_settings
    if fc.queued >= settings.max_queue and not owed:
        raise fc.refused("queue_full", Overloaded(
            f"{fc.queued} requests already wait for a replica slot, the limit "
            f"(GRM_MAX_QUEUE={settings.max_queue}): retry later; raise GRM_MAX_QUEUE or add "
            "replicas", retry_after=1))
    return replica.gate.try_acquire(alone, settings.max_inflight_per_replica)


async def _wait_for_slot(fc: ForwardContext, replica: Replica, alone: bool,
                         owed: bool) -> None:
    """Wait in the queue for a slot on the replica, within its time bound (an `owed` item
    waits as long as it takes)."""
    settings = fc.request_settings
    metrics = fc.metrics
    fc.queued += 1
    metrics.queue_depth.inc()
    started = time.monotonic()
    try:
        async with asyncio.timeout(None if owed else settings.queue_timeout_s):
            await replica.gate.acquire(alone, settings.max_inflight_per_replica)
    except TimeoutError:
        raise fc.refused("queue_timeout", Overloaded(
            f"no slot on replica {replica.name} within GRM_QUEUE_TIMEOUT_S="
            f"{settings.queue_timeout_s:g} s (it serves "
            f"{'one request at a time' if alone else settings.max_inflight_per_replica}): "
            "retry later; raise GRM_QUEUE_TIMEOUT_S or add replicas; a /v1/score batch's "
            "items are never refused this way", retry_after=1)) from None
    finally:
        fc.queued -= 1
        metrics.queue_depth.dec()
        metrics.queue_wait.observe(time.monotonic() - started)
    if not replica.ready:
        # It went down while this request waited for its slot: fail over now.
        await replica.gate.release(alone)
        raise Retryable("down", replica.name, "went down while the request waited")


async def _post(fc: ForwardContext, replica: Replica, path: str, raw: Body) -> tuple[int, bytes]:
    gauge, tally = fc.meters.inflight_gauge(replica.name), fc.metrics.tally
    tally.add(gauge, 1)
    try:
        return await fc.client.post(replica.url, path, *raw)
    except TimeoutError as err:
        raise Retryable("timeout", replica.name, "timed out") from err
    except ResponseTooLarge as err:  # not retried: every replica would answer the same
        raise ResponseTooLarge(f"{replica.name}: {err.message}") from None
    except OSError as err:  # refused, reset, closed early, not HTTP (ConnectionError is one)
        raise Retryable("connection", replica.name, "connection failed",
                        f"{type(err).__name__} to {replica.url}: {err}") from err
    finally:
        tally.add(gauge, -1)


def _decode(replica: Replica, response: tuple[int, bytes]) -> tuple[dict[str, Any], bytes]:
    """The engine's payload, and its bytes where they are strict JSON of it (else b"")."""
    status, content = response
    if status >= 500:
        raise Retryable("status", replica.name, f"HTTP {status}")
    if status in _NOT_ABOUT_THE_BODY:
        raise Retryable("status", replica.name,
                        f"HTTP {status} ({_NOT_ABOUT_THE_BODY[status]})",
                        f"HTTP {status}: {content[:200].decode(errors='replace')}")
    try:
        payload, strict = jsonload.loads_strict(content)
    except ValueError as err:
        if status >= 400:  # a plain-text 4xx (e.g. 404 of a missing route)
            text = content.decode(errors="replace")[:500]
            raise ReplicaRejected(f"engine: {text}", status) from None
        raise Retryable("decode", replica.name, "response is not JSON") from err
    if status >= 400:
        raise ReplicaRejected(_engine_message(payload), status)
    if not isinstance(payload, dict):
        raise Retryable("decode", replica.name, "response is not a JSON object")
    return payload, content if strict else b""


def _engine_message(payload: Any) -> str:
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return f"engine: {error['message']}"
    if isinstance(payload, dict) and payload.get("message"):
        return f"engine: {payload['message']}"
    return f"engine rejected the request: {json.dumps(payload)[:500]}"
