"""Health, readiness, metrics and the service identity, from the FastAPI app in process: with
a STUB replica behind it, and with nothing listening where the replica should be."""

from __future__ import annotations

from pathlib import Path

from grm_service.config import Settings
from tests.support.gateway import client, received, serving
from tests.support.procs import Proc, free_port


async def test_a_served_replica_is_ready_and_named_in_the_identity(stub: Proc,
                                                                   tmp_path: Path) -> None:
    settings = Settings(replica_urls=[stub.url], served_model_name="rm", work_dir=tmp_path)
    async with serving(settings) as (hot, gw), client(hot.app) as api:
        health, ready = await api.get("/health"), await api.get("/ready")
        identity = (await api.get("/v1/fingerprint")).json()
        caps = (await api.get("/v1/capabilities")).json()
        audit = (await api.get("/v1/audit")).json()
        metrics = await api.get("/metrics")
        gw.draining = True
        draining = await api.get("/ready")
        await received(stub.url)
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert ready.status_code == 200
    (replica,) = ready.json()["replicas"]
    assert ready.json()["ready"] is True
    assert (replica["name"], replica["state"], replica["url"]) == ("r0", "ready", stub.url)
    assert identity["identity"] == "unverified" and identity["model"] == "rm"
    assert identity["replicas"] == {"r0": identity["fingerprint_id"]}
    assert caps["batch_invariant"] is False and "unverified" in caps["note"]
    assert (caps["pooling_invariant"], caps["pooling_batched"]) == (False, [])
    assert "/v1/embeddings" in caps["pooling_note"] and "runs alone" in caps["pooling_note"]
    assert (caps["serialize"], caps["routing"]) == (settings.serialize, settings.routing)
    # One unverified replica serves one request at a time; 32 score items admitted per slot.
    assert (caps["slots"], caps["score_items_admitted"], caps["score_max_tokens"]) == (1, 32,
                                                                                         None)
    assert audit["serialized_replicas"] == [] and audit["audited"] == 0
    assert metrics.headers["content-type"].startswith("text/plain")
    assert b'grm_requests_total{replica="",route="/ready",status="200"} 1.0' in metrics.content
    assert draining.status_code == 503 and draining.json()["ready"] is False


async def test_without_a_replica_ready_is_503_and_the_identity_pending(tmp_path: Path) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    settings = Settings(replica_urls=[nobody], work_dir=tmp_path, api_keys=["k1"])
    async with serving(settings, ready=False) as (hot, _), client(hot.app) as anyone, \
            client(hot.app, authorization="Bearer k1") as operator:
        outside, inside = await anyone.get("/ready"), await operator.get("/ready")
        refused = await anyone.get("/v1/fingerprint")
        identity = (await operator.get("/v1/fingerprint")).json()
    assert outside.status_code == 503 and outside.json() == {"ready": False}
    assert inside.status_code == 503
    assert [r["name"] for r in inside.json()["replicas"]] == ["r0"]
    assert inside.json()["replicas"][0]["state"] != "ready"
    assert refused.status_code == 401
    assert identity["fingerprint_id"] == "pending" and identity["unknown"] == ["everything"]

