"""The service identity: what the admitted replicas reported, and what that lets the gateway do.

The gateway's own host says nothing here: the reference is the first admitted replica's own
identity (all others must match it), and the engine's capabilities (may requests share a batch?)
follow the engine that replica runs, at the version it runs.
"""

from __future__ import annotations

from grm_service.config import SerializeMode, Settings
from grm_service.engine_side.identity import ReplicaIdentity
from grm_service.engines import Capabilities, engine_named
from grm_service.fingerprint import Identity
from grm_service.replicas.pool import ReplicaPool

UNVERIFIED = Capabilities(
    batch_invariant=False, sampling_invariant=False,
    note="unverified replicas (no grm identity): their engine's guarantees are unknown, so "
    "requests are serialized per replica",
)
PENDING = Capabilities(batch_invariant=False, sampling_invariant=False,
                       note="no replica admitted yet")


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


def describe(settings: Settings, reference: ReplicaIdentity | None, caps: Capabilities,
             pool: ReplicaPool) -> Identity:
    """`GET /v1/fingerprint`: the reference identity, which parts are unknown, every replica."""
    replicas = {r.name: r.identity.fingerprint_id(settings.seed) if r.identity else r.state.value
                for r in pool.replicas}
    serialized = always_serialized(caps, settings.serialize)
    if reference is None:
        return Identity(fingerprint_id="pending", identity="pending", seed=settings.seed,
                        model=settings.model_name, model_hash=None, env_digest=None, engine=None,
                        engine_version=None, device=None, tensor_parallel_size=None,
                        serialized=serialized, env_inputs={}, unknown=["everything"],
                        replicas=replicas)
    return Identity(
        fingerprint_id=reference.fingerprint_id(settings.seed),
        identity="verified" if reference.verified else "unverified", seed=settings.seed,
        model=settings.model_name, model_hash=reference.model_hash,
        env_digest=reference.env_digest, engine=reference.engine,
        engine_version=reference.engine_version, device=reference.device,
        tensor_parallel_size=reference.tensor_parallel_size, serialized=serialized,
        env_inputs=reference.env_inputs, unknown=reference.unknown, replicas=replicas,
    )
