"""The service identity: the one holder of the reference identity, and what it lets the gateway do.

Names, once: a replica reports its `ReplicaIdentity` (engine_side/identity.py); the service's
reference is the first admitted replica's, held by `ServiceIdentity` (one per process, built with
the process; admission settles it where the keeper runs, the replica snapshot settles it in the
serving workers of `serve --workers N`); everything else reads it there. `GET /v1/fingerprint`
shows it as an `IdentityReport`; one answer's `Fingerprint` (fingerprint.py) carries the serving
replica's identity.

The gateway's own host says nothing here: all other replicas must match the reference, and the
engine's capabilities (may requests share a batch?) follow the engine that replica runs, at the
version it runs.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel

from grm_service import __version__
from grm_service.config import SerializeMode, Settings
from grm_service.engine_side.identity import ReplicaIdentity
from grm_service.engines import Capabilities, engine_named
from grm_service.metrics import Metrics
from grm_service.replicas.pool import ReplicaPool

log = logging.getLogger(__name__)

UNVERIFIED = Capabilities(
    batch_invariant=False, sampling_invariant=False,
    note="unverified replicas (no grm identity): their engine's guarantees are unknown, so "
    "requests are serialized per replica",
)
PENDING = Capabilities(batch_invariant=False, sampling_invariant=False,
                       note="no replica admitted yet")
PENDING_ID = "pending"


def capabilities_of(settings: Settings, identity: ReplicaIdentity) -> Capabilities:
    if not identity.verified:
        return UNVERIFIED
    env = identity.env_inputs.get("env")
    profile = engine_named(identity.engine, settings)
    return profile.capabilities(identity.engine_version, env if isinstance(env, dict) else {})


def always_serialized(caps: Capabilities, mode: SerializeMode) -> bool:
    if mode is not SerializeMode.AUTO:
        return mode is SerializeMode.ON
    return not caps.batch_invariant


class IdentityReport(BaseModel):
    """`GET /v1/fingerprint`: the identity the admitted replicas reported (`identity` says
    whether they proved it: verified | unverified | pending), with the env-digest inputs in
    clear (numerics-relevant variables only) and each replica's fingerprint id."""

    fingerprint_id: str
    identity: str
    seed: int
    model: str
    model_hash: str | None
    env_digest: str | None
    engine: str | None
    engine_version: str | None
    device: str | None
    tensor_parallel_size: int | None
    serialized: bool
    env_inputs: dict[str, Any]
    unknown: list[str]
    replicas: dict[str, str]


class ServiceIdentity:
    """The reference identity of this service (None until a replica is admitted) and the
    capabilities it implies. Settled once per reference; `settle` with an equal one is a no-op."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.reference: ReplicaIdentity | None = None
        self.capabilities = PENDING
        self._metrics = metrics
        self._engine_max_tokens: int | None = None

    @property
    def score_max_tokens(self) -> int | None:
        """The cap on a scorer's max_tokens where its batch sets none: GRM_SCORE_MAX_TOKENS,
        else the reference engine's (`Engine.score_max_tokens`; unknown for unverified
        replicas: none)."""
        if self.settings.score_max_tokens is not None:
            return self.settings.score_max_tokens
        return self._engine_max_tokens

    @property
    def fingerprint_id(self) -> str:
        ref = self.reference
        return ref.fingerprint_id(self.settings.seed) if ref is not None else PENDING_ID

    def settle(self, reference: ReplicaIdentity) -> None:
        if reference == self.reference:
            return
        self.reference = reference
        self.capabilities = capabilities_of(self.settings, reference)
        self._engine_max_tokens = (engine_named(reference.engine, self.settings).score_max_tokens
                                   if reference.verified else None)
        cap = self.score_max_tokens
        if cap is not None:
            log.info("scorers ask for at most %d tokens where a batch's sampling sets no "
                     "max_tokens (OCR's own: 4096; engine %s; GRM_SCORE_MAX_TOKENS sets "
                     "another): longer transcripts are cut there", cap, reference.engine)
        if self._metrics is not None:
            self._metrics.info.info({
                "seed": str(self.settings.seed), "fingerprint": self.fingerprint_id,
                "engine": str(reference.engine), "identity": _kind(reference),
                "version": __version__})

    def report(self, pool: ReplicaPool) -> IdentityReport:
        """The reference identity, which parts are unknown, every replica's fingerprint id."""
        settings, ref = self.settings, self.reference
        replicas = {r.name: r.identity.fingerprint_id(settings.seed) if r.identity
                    else r.state.value for r in pool.replicas}
        serialized = always_serialized(self.capabilities, settings.serialize)
        if ref is None:
            return IdentityReport(
                fingerprint_id=PENDING_ID, identity=PENDING_ID, seed=settings.seed,
                model=settings.model_name, model_hash=None, env_digest=None, engine=None,
                engine_version=None, device=None, tensor_parallel_size=None,
                serialized=serialized, env_inputs={}, unknown=["everything"],
                replicas=replicas)
        return IdentityReport(
            fingerprint_id=self.fingerprint_id, identity=_kind(ref), seed=settings.seed,
            model=settings.model_name, model_hash=ref.model_hash, env_digest=ref.env_digest,
            engine=ref.engine, engine_version=ref.engine_version, device=ref.device,
            tensor_parallel_size=ref.tensor_parallel_size, serialized=serialized,
            env_inputs=ref.env_inputs, unknown=ref.unknown, replicas=replicas,
        )


def _kind(identity: ReplicaIdentity) -> str:
    return "verified" if identity.verified else "unverified"
