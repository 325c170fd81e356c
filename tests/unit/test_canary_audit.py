from __future__ import annotations

import asyncio
import random

from grm_service.audit import Auditor
from grm_service.canary import Canary
from grm_service.config import NondeterminismPolicy, Settings
from grm_service.fingerprint import Fingerprint
from grm_service.metrics import Metrics
from grm_service.replicas import Replica


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


def fp(response_digest: str, replica: str) -> Fingerprint:
    return Fingerprint(fingerprint_id="grm-1", identity="verified", seed=1, model_hash="m",
                       env_digest="e", engine="vllm", engine_version="1", device="cpu",
                       replica=replica, serialized=False, request_digest="q",
                       response_digest=response_digest)


async def finished(auditor: Auditor) -> None:
    """Until every audit re-run submitted has been compared (however long that takes here)."""
    async with asyncio.timeout(60):
        while auditor.report()["in_progress"]:
            await asyncio.sleep(0.005)


async def test_audit_counts_matches_and_violations_and_rate_limits() -> None:
    auditor = Auditor(1.0, 1000.0, Metrics(), random.Random(0))
    answers = iter(["same", "other"])

    async def rerun(path: str, body: dict[str, object], pin: str) -> Fingerprint:
        return fp(next(answers), pin)

    auditor.submit("/v1/chat/completions", {}, fp("same", "r0"), ["r1"], rerun)
    auditor.submit("/v1/chat/completions", {}, fp("same", "r0"), ["r1"], rerun)
    auditor.submit("/v1/chat/completions", {}, fp("same", "r0"), [], rerun)  # nobody to ask
    await finished(auditor)
    report = auditor.report()
    assert (report["audited"], report["matched"], report["violations"]) == (2, 1, 1)
    violation = report["recent_violations"][0]
    assert violation["first"]["replica"] == "r0" and violation["second"]["replica"] == "r1"

    slow = Auditor(1.0, 1.0, Metrics())
    for _ in range(5):
        slow.submit("/p", {}, fp("same", "r0"), ["r1"], rerun)
    assert slow.report()["rate_limited"] == 4
    await slow.close()


async def test_audit_samples_the_configured_fraction() -> None:
    auditor = Auditor(0.1, 1e9, Metrics(), random.Random(1))

    async def rerun(path: str, body: dict[str, object], pin: str) -> Fingerprint:
        return fp("same", pin)

    for _ in range(2000):
        auditor.submit("/p", {}, fp("same", "r0"), ["r1"], rerun)
    await finished(auditor)
    assert 150 < auditor.report()["audited"] < 250
