"""Admission: who a replica is, and whether it may join the ones already serving.

Before anything is routed to a replica the gateway reads the identity the replica computed itself
(`GET /grm/identity`, see `replica_identity`). A plain vLLM server has no such route: it is
admitted as `unverified`, with only what its API says (`/v1/models`, `/version`) and nothing made
up. The first replica admitted settles the service's reference identity (`ServiceIdentity`, the
one holder, handed in); a later replica whose
identity differs is refused with the parts that differ named. Then the canary (if on) proves the
replica's outputs, against the reference answers of replicas with the same identity: a replica
that claims the identity but computes something else (weights changed under it) is refused there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from pydantic import ValidationError

from grm_service.config import Settings
from grm_service.engine_side.identity import IDENTITY_PATH, ReplicaIdentity, unverified_identity
from grm_service.replicas.identity import ServiceIdentity
from grm_service.replicas.pool import Replica

log = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 5.0
_COMPUTING_POLL_S = 0.5

# An output check run after the identity matched (the canary): a problem sentence or None.
OutputCheck = Callable[[Replica, httpx.AsyncClient], Awaitable[str | None]]


class IdentityError(Exception):
    """The replica answered /health but not a usable identity."""


async def _get(client: httpx.AsyncClient, url: str) -> httpx.Response:
    try:
        return await client.get(url, timeout=_PROBE_TIMEOUT_S)
    except httpx.HTTPError as err:
        raise IdentityError(f"GET {url} failed: {type(err).__name__}") from err


def _json(response: httpx.Response) -> Any:
    status, path = response.status_code, response.request.url.path
    if status in (401, 403):
        raise IdentityError(f"GET {path} answered {status}: the replica requires a key the "
                            "gateway does not hold (set GRM_REPLICA_API_KEY)")
    if status != 200:
        raise IdentityError(f"GET {path} answered {status}")
    try:
        return response.json()
    except ValueError as err:
        raise IdentityError(f"GET {response.request.url.path} did not answer JSON") from err


async def _plain_vllm(client: httpx.AsyncClient, base_url: str) -> ReplicaIdentity:
    models, version = await asyncio.gather(_get(client, base_url + "/v1/models"),
                                           _get(client, base_url + "/version"))
    try:
        (model,) = _json(models)["data"]
        served, root = str(model["id"]), str(model.get("root") or model["id"])
        max_len = model.get("max_model_len")
        return unverified_identity(served, root, int(max_len) if max_len is not None else None,
                                   str(_json(version)["version"]))
    except (KeyError, TypeError, ValueError) as err:
        # ValueError also covers a replica serving several models (the unpacking above).
        raise IdentityError(f"unexpected /v1/models or /version: {err!r}") from err


async def fetch_identity(
    client: httpx.AsyncClient, base_url: str, wait_s: float
) -> ReplicaIdentity:
    """The replica's own identity; waits (up to `wait_s`) while it is still hashing its model."""
    deadline = time.monotonic() + wait_s
    while True:
        response = await _get(client, base_url + IDENTITY_PATH)
        if response.status_code == 404:
            return await _plain_vllm(client, base_url)
        if response.status_code != 503 or time.monotonic() > deadline:
            try:
                return ReplicaIdentity.model_validate(_json(response))
            except ValidationError as err:
                raise IdentityError(f"malformed identity: {err.error_count()} error(s)") from err
        await asyncio.sleep(_COMPUTING_POLL_S)


class Admission:
    """Identity, then outputs; one replica at a time, so the reference is settled first."""

    def __init__(self, settings: Settings, client: httpx.AsyncClient,
                 outputs: OutputCheck | None = None,
                 identity: ServiceIdentity | None = None) -> None:
        self.settings = settings
        self.identity = identity if identity is not None else ServiceIdentity(settings)
        self._client = client
        self._outputs = outputs
        self._lock = asyncio.Lock()

    async def check(self, replica: Replica) -> str | None:
        """None to admit; else why not. Sets `replica.identity` when one was read."""
        async with self._lock:
            try:
                identity = await fetch_identity(self._client, replica.url,
                                                self.settings.startup_timeout_s)
            except IdentityError as err:
                return f"identity unknown: {err}"
            replica.identity = identity
            if problem := self._compare(identity):
                return problem
            if self._outputs is not None and (problem := await self._outputs(replica,
                                                                              self._client)):
                return problem
            if self.identity.reference is None:
                self._settle(replica, identity)
            return None

    def _compare(self, identity: ReplicaIdentity) -> str | None:
        expected = self.settings.model_name
        if identity.served_model != expected:
            return (f"serves model {identity.served_model!r}, but this gateway serves "
                    f"{expected!r} (--served-model-name)")
        reference = self.identity.reference
        if reference is not None and (diffs := identity.differences(reference)):
            return "identity differs from the admitted replicas': " + "; ".join(diffs)
        return None

    def _settle(self, replica: Replica, identity: ReplicaIdentity) -> None:
        self.identity.settle(identity)
        kind = "verified" if identity.verified else "UNVERIFIED (plain vLLM: " + ", ".join(
            identity.unknown) + " unknown)"
        log.info("service identity from %s: %s, %s", replica.name,
                 identity.fingerprint_id(self.settings.seed), kind)
