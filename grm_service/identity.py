"""The service identity: seed, model hash and env digest, computed once at start-up."""

from __future__ import annotations

from grm_service.config import Settings
from grm_service.engines import Engine
from grm_service.fingerprint import Identity, env_digest, fingerprint_id, model_hash


def build_identity(settings: Settings, engine: Engine, serialized: bool) -> Identity:
    """Blocking (hashes the model on a cache miss): run it off the event loop."""
    inputs = engine.env_inputs()
    if settings.attach:
        inputs["launcher"] = "attach"
    mhash = model_hash(settings.model, settings.cache_dir) if settings.model else "name:attached"
    digest = env_digest(inputs)
    return Identity(
        fingerprint_id=fingerprint_id(settings.seed, mhash, digest), seed=settings.seed,
        model=settings.model_name, model_hash=mhash, env_digest=digest, engine=engine.name,
        engine_version=inputs["engine_version"], serialized=serialized, env_inputs=inputs,
    )
