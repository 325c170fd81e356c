"""Replicas started elsewhere (`--backend-url`): check who they are, watch them, route to the ready.

A replica is admitted only after its identity is checked: the model it serves (`/v1/models`) must
be the gateway's `--served-model-name`, and its model root, context length and engine version
(`/version`) must match the first replica admitted. A mismatch would break determinism silently
(two engines, two sets of bits), so the replica is REJECTED: logged, shown in /ready, never routed
to. Every health round re-probes non-ready replicas, so one fixed and restarted is admitted again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import httpx

from grm_service.config import Settings
from grm_service.metrics import Metrics
from grm_service.replicas import Replica, ReplicaPool, ReplicaState

log = logging.getLogger(__name__)

_HEALTH_EVERY_S = 1.0
_PROBE_TIMEOUT_S = 5.0

# Extra admission checks (the start-up canary plugs in here): given a replica whose identity
# matched, return None to admit it or a sentence saying why it is rejected.
AdmissionCheck = Callable[[Replica, httpx.AsyncClient], Awaitable[str | None]]


class IdentityError(Exception):
    """A replica answered its health check but not the identity probe."""


@dataclass(frozen=True)
class ReplicaIdentity:
    """What an attached replica says it runs; every field must agree across replicas."""

    served_model: str
    model_root: str
    max_model_len: int | None
    engine_version: str

    def differences(self, other: ReplicaIdentity) -> list[str]:
        return [
            f"{f.name} {getattr(self, f.name)!r} != {getattr(other, f.name)!r}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]


async def _get_json(client: httpx.AsyncClient, url: str) -> Any:
    try:
        response = await client.get(url, timeout=_PROBE_TIMEOUT_S)
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, ValueError) as err:
        raise IdentityError(f"GET {url} failed: {err}") from err


async def fetch_identity(client: httpx.AsyncClient, base_url: str) -> ReplicaIdentity:
    """Read an OpenAI-compatible vLLM server's identity from `/v1/models` and `/version`."""
    models, version = await asyncio.gather(
        _get_json(client, base_url + "/v1/models"), _get_json(client, base_url + "/version")
    )
    try:
        (model,) = models["data"]
        engine_version = str(version["version"])
        served, root = str(model["id"]), str(model.get("root") or model["id"])
        max_len = model.get("max_model_len")
    except (KeyError, TypeError, ValueError) as err:
        # ValueError also covers a replica serving several models (the unpacking above).
        raise IdentityError(f"{base_url}: unexpected /v1/models or /version: {err!r}") from err
    return ReplicaIdentity(served, root, int(max_len) if max_len is not None else None,
                           engine_version)


async def _healthy(client: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await client.get(url + "/health", timeout=_PROBE_TIMEOUT_S)).status_code == 200
    except httpx.HTTPError:
        return False


class AttachedReplicas:
    """Same verbs as the Supervisor (start, stop, pool), without owning any process."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        client: httpx.AsyncClient | None = None,
        checks: Sequence[AdmissionCheck] = (),
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.pool = ReplicaPool(
            [Replica(name=f"r{i}", url=url) for i, url in enumerate(settings.backend_urls)]
        )
        self.reference: ReplicaIdentity | None = None
        self._client = client or httpx.AsyncClient()
        self._checks = tuple(checks)
        self._monitor: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.check_all()
        self._monitor = asyncio.create_task(self._watch(), name="grm-attach-monitor")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(_HEALTH_EVERY_S)
            await self.check_all()

    async def check_all(self) -> None:
        """Probe every replica at once, then admit in name order, so the reference is r0's when
        r0 is up (a stable rule, not whichever answered first)."""
        replicas = self.pool.replicas
        healthy = await asyncio.gather(*(_healthy(self._client, r.url) for r in replicas))
        for replica, ok in zip(replicas, healthy, strict=True):
            if not ok:
                self._set(replica, ReplicaState.DOWN, "health check failed")
            elif replica.state is not ReplicaState.READY:
                problem = await self._admission_problem(replica)
                if problem:
                    self._set(replica, ReplicaState.REJECTED, problem)
                else:
                    self._set(replica, ReplicaState.READY, "")

    async def _admission_problem(self, replica: Replica) -> str | None:
        try:
            identity = await fetch_identity(self._client, replica.url)
        except IdentityError as err:
            return f"identity unknown: {err}"
        expected = self.settings.model_name
        if identity.served_model != expected:
            return (f"serves model {identity.served_model!r}, but this gateway serves "
                    f"{expected!r} (--served-model-name)")
        if self.reference is None:
            self.reference = identity
            log.info("attached replicas must match %s (%s)", replica.name, identity)
        elif diffs := identity.differences(self.reference):
            return "differs from the first admitted replica: " + "; ".join(diffs)
        for check in self._checks:
            if problem := await check(replica, self._client):
                return problem
        return None

    def _set(self, replica: Replica, state: ReplicaState, detail: str) -> None:
        if (state, detail) != (replica.state, replica.detail):
            level = logging.ERROR if state is ReplicaState.REJECTED else logging.INFO
            log.log(level, "attached replica %s (%s) is %s%s", replica.name, replica.url, state,
                    f": {detail}" if detail else "")
        replica.state, replica.detail = state, detail
        self.metrics.replica_up.labels(replica=replica.name).set(int(state is ReplicaState.READY))

    async def stop(self) -> None:
        if self._monitor:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        for replica in self.pool.replicas:
            replica.state = ReplicaState.STOPPED
        await self._client.aclose()
