"""Attach mode admits a replica only when its identity matches (MockTransport replicas)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from grm_service.attach import AttachedReplicas, ReplicaIdentity
from grm_service.config import Settings
from grm_service.metrics import Metrics
from grm_service.replicas import Replica, ReplicaState

GOOD = {"model": "rm", "root": "/models/rm", "len": 512, "version": "0.11.0", "health": 200}


def transport(replicas: dict[str, dict[str, Any]]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        r = replicas[request.url.host]
        if request.url.path == "/health":
            return httpx.Response(r["health"])
        if request.url.path == "/version":
            return httpx.Response(200, json={"version": r["version"]})
        if request.url.path == "/v1/models" and "model" in r:
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": r["model"], "root": r["root"], "max_model_len": r["len"]}]})
        return httpx.Response(404)

    return httpx.MockTransport(handle)


def attached(replicas: dict[str, dict[str, Any]], **settings: Any) -> AttachedReplicas:
    urls = [f"http://{host}:8000" for host in replicas]
    client = httpx.AsyncClient(transport=transport(replicas))
    return AttachedReplicas(Settings(backend_urls=urls, served_model_name="rm", **settings),
                            Metrics(), client=client)


def states(source: AttachedReplicas) -> list[str]:
    return [r.state.value for r in source.pool.replicas]


async def test_matching_replicas_are_admitted() -> None:
    source = attached({"a": GOOD, "b": dict(GOOD)})
    await source.check_all()
    assert states(source) == ["ready", "ready"]
    assert source.reference == ReplicaIdentity("rm", "/models/rm", 512, "0.11.0")
    await source.stop()


@pytest.mark.parametrize(("change", "words"), [
    ({"version": "0.12.0"}, "engine_version '0.12.0' != '0.11.0'"),
    ({"root": "/models/other"}, "model_root"),
    ({"len": 1024}, "max_model_len 1024 != 512"),
])
async def test_a_replica_unlike_the_first_is_rejected(change: dict[str, Any], words: str) -> None:
    source = attached({"a": GOOD, "b": {**GOOD, **change}})
    await source.check_all()
    assert states(source) == ["ready", "rejected"]
    assert words in source.pool.replicas[1].detail
    assert [r.name for r in source.pool.ready()] == ["r0"]
    await source.stop()


async def test_wrong_served_model_name_is_rejected() -> None:
    source = attached({"a": {**GOOD, "model": "other"}})
    await source.check_all()
    replica = source.pool.replicas[0]
    assert replica.state is ReplicaState.REJECTED
    assert "'other'" in replica.detail and "'rm'" in replica.detail
    await source.stop()


async def test_replica_without_v1_models_is_rejected() -> None:
    source = attached({"a": {"version": "x", "health": 200}})
    await source.check_all()
    assert states(source) == ["rejected"]
    assert "/v1/models" in source.pool.replicas[0].detail
    await source.stop()


async def test_down_replica_is_readmitted_once_fixed() -> None:
    replicas = {"a": {**GOOD, "health": 503}}
    source = attached(replicas)
    await source.check_all()
    assert states(source) == ["down"]
    replicas["a"]["health"] = 200
    await source.check_all()
    assert states(source) == ["ready"]
    await source.stop()


async def test_admission_checks_run_after_identity() -> None:
    seen: list[str] = []

    async def canary(replica: Replica, client: httpx.AsyncClient) -> str | None:
        seen.append(replica.name)
        return "canary output differs" if replica.name == "r1" else None

    urls = ["http://a:8000", "http://b:8000"]
    client = httpx.AsyncClient(transport=transport({"a": GOOD, "b": GOOD}))
    source = AttachedReplicas(Settings(backend_urls=urls, served_model_name="rm"), Metrics(),
                              client=client, checks=[canary])
    await source.check_all()
    assert seen == ["r0", "r1"] and states(source) == ["ready", "rejected"]
    assert source.pool.replicas[1].detail == "canary output differs"
    await source.stop()
