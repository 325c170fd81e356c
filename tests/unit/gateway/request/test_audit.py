from __future__ import annotations

import asyncio
import random

from grm_service.fingerprint import Fingerprint
from grm_service.gateway.request.audit import Auditor
from grm_service.metrics import Metrics


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
