"""Start-up canary: a replica proves itself before it is routed to.

It answers a small probe set twice, alone (one request at a time) and co-batched with filler
traffic; both runs must agree bit for bit, and must agree with the first admitted replica that
claims the same identity (a replica that claims an identity but computes something else, such as
weights changed under it, is caught here).
A replica that fails is refused (`--on-nondeterminism fail`) or admitted but serialized
(`serialize`, only when the failure is co-batching: a replica that disagrees with the others
even alone computes something else, and no scheduling makes it right).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import httpx

from grm_service.config import NondeterminismPolicy, Settings
from grm_service.fingerprint import response_digest
from grm_service.metrics import Metrics
from grm_service.probes import builtin_probes, filler_requests
from grm_service.replicas.pool import Replica

log = logging.getLogger(__name__)

_CHAT = "/v1/chat/completions"


class CanaryUnsupported(Exception):
    """The replica does not serve chat completions (e.g. a pooling model)."""


@dataclass(frozen=True)
class Verdict:
    problem: str | None  # the condition that failed, or None
    serialize: bool = False


def _digest(payload: Any) -> str:
    """The answer's response digest, the one its fingerprint would carry."""
    if not isinstance(payload, dict) or not payload.get("choices"):
        raise ValueError("no choices")  # every answer would digest alike: nothing proven
    return response_digest(payload)


class Canary:
    """An admission check: `await canary(replica, client)` -> problem text or None."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        base = {"model": settings.model_name, "seed": settings.seed}
        self.probes = [{**p, **base} for p in builtin_probes(settings.canary_probes, 16)]
        self.filler = [{**f, **base} for f in filler_requests(2 * settings.canary_probes)]
        self.references: dict[str, list[str]] = {}  # by fingerprint id of the claimed identity
        self._lock = asyncio.Lock()

    async def _send(self, client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> str:
        r = await client.post(url + _CHAT, json=body, timeout=self.settings.request_timeout_s)
        if r.status_code in (400, 404, 405) and body in self.probes[:1]:
            raise CanaryUnsupported(f"HTTP {r.status_code}: {r.text[:200]}")
        r.raise_for_status()
        return _digest(r.json())

    async def _runs(self, client: httpx.AsyncClient, url: str) -> tuple[list[str], list[str]]:
        alone = [await self._send(client, url, body) for body in self.probes]
        mixed = await asyncio.gather(
            *(self._send(client, url, body) for body in self.probes + self.filler)
        )
        return alone, list(mixed[: len(self.probes)])

    def judge(self, alone: list[str], batched: list[str], reference: list[str] | None = None
              ) -> Verdict:
        if reference is not None and alone != reference:
            n = sum(a != r for a, r in zip(alone, reference, strict=True))
            return Verdict(f"{n}/{len(alone)} probe answers differ from the first admitted "
                           "replica's with the same identity (alone): different numerics "
                           "(weights changed under it, dtype, engine?)")
        if batched != alone:
            n = sum(a != b for a, b in zip(alone, batched, strict=True))
            serialize = self.settings.on_nondeterminism is NondeterminismPolicy.SERIALIZE
            return Verdict(f"{n}/{len(alone)} probe answers change when co-batched with other "
                           "requests", serialize=serialize)
        return Verdict(None)

    async def __call__(self, replica: Replica, client: httpx.AsyncClient) -> str | None:
        async with self._lock:  # one canary at a time: the reference must be settled first
            try:
                alone, batched = await self._runs(client, replica.url)
            except CanaryUnsupported as err:
                log.warning("canary skipped for %s: no chat completions (%s)", replica.name, err)
                return None
            except httpx.HTTPError as err:
                return f"canary probe failed: {type(err).__name__}"
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                # A 200 that is not a chat completion (an HTML page, broken JSON).
                return f"canary probe answered something other than a completion ({err!r:.80})"
            key = self._key(replica)
            verdict = self.judge(alone, batched, self.references.get(key))
            return self._apply(replica, verdict, alone, key)

    def _key(self, replica: Replica) -> str:
        ident = replica.identity
        return ident.fingerprint_id(self.settings.seed) if ident else "unknown"

    def _apply(self, replica: Replica, verdict: Verdict, alone: list[str], key: str
               ) -> str | None:
        if verdict.problem is None:
            self.references.setdefault(key, alone)
            log.info("canary passed for %s (%d probes, alone and co-batched)", replica.name,
                     len(alone))
            return None
        self.metrics.violations.labels(source="canary").inc()
        if verdict.serialize:
            self.references.setdefault(key, alone)
            replica.serialized = True
            self.metrics.replica_serialized.labels(replica=replica.name).set(1)
            log.error("canary: %s %s; serializing it (one request at a time)", replica.name,
                      verdict.problem)
            return None
        log.error("canary: %s %s; refusing it", replica.name, verdict.problem)
        return f"canary failed: {verdict.problem}"
