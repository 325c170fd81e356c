"""The service identity: what the reference replica reported decides the capabilities, the
serialization and what `GET /v1/fingerprint` shows."""

from __future__ import annotations

from typing import Any

import pytest

from grm_service.config import SerializeMode, Settings
from grm_service.engine_side.identity import ReplicaIdentity
from grm_service.engines import Capabilities
from grm_service.metrics import Metrics
from grm_service.replicas.identity import (
    PENDING,
    UNVERIFIED,
    ServiceIdentity,
    always_serialized,
    capabilities_of,
)
from grm_service.replicas.pool import Replica, ReplicaPool, ReplicaState
from tests.unit.replicas.test_keeper import identity

SETTINGS = Settings(model="/models/m", served_model_name="rm", seed=5)


def reported(**over: Any) -> ReplicaIdentity:
    return ReplicaIdentity.model_validate(identity(**over))


def test_an_unverified_replica_gets_no_guarantees() -> None:
    plain = reported(verified=False, model_hash=None, env_digest=None)
    assert capabilities_of(SETTINGS, plain) is UNVERIFIED


def test_capabilities_follow_the_engine_the_replica_runs() -> None:
    gpu = capabilities_of(SETTINGS, reported())
    assert gpu.batch_invariant is True and "VLLM_BATCH_INVARIANT=1" in gpu.note
    cpu = capabilities_of(SETTINGS, reported(engine="vllm-cpu"))
    assert cpu.batch_invariant is False and "CPU" in cpu.note


@pytest.mark.parametrize(("invariant", "mode", "serialized"), [
    (True, SerializeMode.AUTO, False),
    (False, SerializeMode.AUTO, True),
    (True, SerializeMode.ON, True),
    (False, SerializeMode.OFF, False),
])
def test_always_serialized(invariant: bool, mode: SerializeMode, serialized: bool) -> None:
    caps = Capabilities(batch_invariant=invariant, sampling_invariant=invariant, note="")
    assert always_serialized(caps, mode) is serialized


def test_before_any_replica_is_admitted_everything_is_unknown() -> None:
    pool = ReplicaPool([Replica("r0", "u"), Replica("r1", "u", state=ReplicaState.DOWN)])
    held = ServiceIdentity(SETTINGS)
    assert held.capabilities is PENDING and held.fingerprint_id == "pending"
    shown = held.report(pool)
    assert (shown.fingerprint_id, shown.identity, shown.unknown) == ("pending", "pending",
                                                                      ["everything"])
    assert shown.replicas == {"r0": "starting", "r1": "down"}
    assert (shown.seed, shown.model, shown.serialized) == (5, "rm", True)


def test_the_reference_identity_is_shown_with_each_replicas_fingerprint() -> None:
    ref = reported()
    other = reported(env_digest="e2")
    pool = ReplicaPool([Replica("r0", "u", identity=ref), Replica("r1", "u", identity=other),
                        Replica("r2", "u")])
    held = ServiceIdentity(SETTINGS)
    held.settle(ref)
    shown = held.report(pool)
    assert shown.fingerprint_id == ref.fingerprint_id(5) != other.fingerprint_id(5)
    assert shown.replicas == {"r0": ref.fingerprint_id(5), "r1": other.fingerprint_id(5),
                              "r2": "starting"}
    assert (shown.identity, shown.model_hash, shown.env_digest) == ("verified", "blake3:aa", "e1")
    assert (shown.engine, shown.device, shown.serialized) == ("vllm", "NVIDIA H200 (driver 1)",
                                                              False)
    assert shown.env_inputs == ref.env_inputs and shown.unknown == []


def test_a_tensor_parallel_replica_shows_its_size_in_the_fingerprint() -> None:
    ref = reported(tensor_parallel_size=2, env_digest="e-tp2")
    pool = ReplicaPool([Replica("r0", "u", identity=ref)])
    held = ServiceIdentity(SETTINGS)
    held.settle(ref)
    shown = held.report(pool)
    assert shown.tensor_parallel_size == 2
    assert shown.fingerprint_id != reported().fingerprint_id(5)


def test_settling_sets_the_capabilities_and_the_info_metric_once_per_reference() -> None:
    metrics = Metrics()
    held = ServiceIdentity(SETTINGS, metrics)
    ref = reported()
    held.settle(ref)
    assert held.reference is ref and held.capabilities == capabilities_of(SETTINGS, ref)
    assert held.fingerprint_id == ref.fingerprint_id(5)
    text = metrics.render().decode()
    assert f'fingerprint="{ref.fingerprint_id(5)}"' in text and 'identity="verified"' in text
    held.settle(reported())  # an equal identity from another snapshot: nothing changes
    assert held.reference is ref
    moved = reported(engine="vllm-cpu")
    held.settle(moved)
    assert held.reference is moved and held.capabilities.batch_invariant is False


@pytest.mark.parametrize(("engine", "verified", "setting", "cap"), [
    ("vllm-cpu", True, None, 256),  # 4096 OCR tokens take minutes per item on CPU
    ("vllm", True, None, None),  # the scorers' own
    ("vllm-cpu", False, None, None),  # an unverified replica's engine is not known
    ("vllm", True, 64, 64),  # GRM_SCORE_MAX_TOKENS, whatever the engine
])
def test_the_scorers_max_tokens_follow_the_reference_engine_unless_set(
    engine: str, verified: bool, setting: int | None, cap: int | None
) -> None:
    held = ServiceIdentity(SETTINGS.model_copy(update={"score_max_tokens": setting}))
    extra = {} if verified else {"model_hash": None, "env_digest": None}
    held.settle(reported(engine=engine, verified=verified, **extra))
    assert held.score_max_tokens == cap
