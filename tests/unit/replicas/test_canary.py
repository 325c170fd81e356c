from __future__ import annotations

from grm_service.config import NondeterminismPolicy, Settings
from grm_service.metrics import Metrics
from grm_service.replicas.canary import Canary
from grm_service.replicas.pool import Replica


def canary(policy: NondeterminismPolicy) -> Canary:
    return Canary(Settings(model="m", on_nondeterminism=policy), Metrics())


def test_canary_first_clean_replica_becomes_the_reference_of_its_identity() -> None:
    c = canary(NondeterminismPolicy.FAIL)
    assert c._apply(Replica("r0", "u"), c.judge(["a", "b"], ["a", "b"]), ["a", "b"], "X") is None
    assert c.references == {"X": ["a", "b"]}
    verdict = c.judge(["a", "c"], ["a", "c"], c.references["X"])
    problem = c._apply(Replica("r1", "u"), verdict, ["a", "c"], "X")
    assert problem is not None and "differ from the first admitted replica" in problem


def test_canary_batch_variance_fails_or_serializes() -> None:
    failing = canary(NondeterminismPolicy.FAIL)
    verdict = failing.judge(["a", "b"], ["a", "x"])
    problem = failing._apply(Replica("r0", "u"), verdict, ["a", "b"], "X")
    assert problem is not None and "co-batched" in problem
    serializing = canary(NondeterminismPolicy.SERIALIZE)
    replica = Replica("r0", "u")
    assert serializing._apply(replica, serializing.judge(["a"], ["x"]), ["a"], "X") is None
    assert replica.serialized is True
    text = serializing.metrics.registry.get_sample_value(
        "grm_determinism_violations_total", {"source": "canary"})
    assert text == 1.0
