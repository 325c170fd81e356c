"""`/metrics/targets` (Prometheus HTTP service discovery) and `/metrics/engine` (each replica's
own /metrics, relayed), in process, a STUB replica behind (the gateway's relay is under test);
the compose check scrapes a real vLLM this way."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from grm_service.config import Settings
from tests.support.gateway import client, serving
from tests.support.procs import Proc


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_targets_list_every_replica_behind_the_relay(stub: Proc, tmp_path: Path) -> None:
    settings = Settings(replica_urls=[stub.url, f"http://127.0.0.1:{closed_port()}"],
                        served_model_name="rm", work_dir=tmp_path)
    async with serving(settings, ready=False) as (hot, gw), client(hot.app) as api:
        async with asyncio.timeout(10):  # r0 admitted; r1 never answers
            while not gw.pool.ready():
                await asyncio.sleep(0.02)
        found = (await api.get("/metrics/targets", headers={"host": "grm:8000"})).json()
        assert found == [
            {"targets": ["grm:8000"], "labels": {"replica": name, "__param_replica": name,
                                                 "__metrics_path__": "/metrics/engine"}}
            for name in ("r0", "r1")]
        relayed = await api.get("/metrics/engine", params={"replica": "r0"})
        assert relayed.status_code == 200
        assert 'vllm:num_requests_running{model_name="rm"} 0' in relayed.text
        assert relayed.headers["content-type"].startswith("text/plain; version=0.0.4")
        down = await api.get("/metrics/engine", params={"replica": "r1"})
        assert down.status_code == 503 and "replica r1" in down.text  # its target: up 0
        unknown = await api.get("/metrics/engine", params={"replica": "r9"})
        assert unknown.status_code == 400 and "r0, r1" in unknown.text


async def test_the_relay_is_open_like_metrics_and_keyed_with_metrics_auth(
        stub: Proc, tmp_path: Path) -> None:
    for metrics_auth, status in ((False, 200), (True, 401)):
        settings = Settings(replica_urls=[stub.url], served_model_name="rm", work_dir=tmp_path,
                            api_keys=["k"], metrics_auth=metrics_auth)
        async with serving(settings) as (hot, _), client(hot.app) as api:
            for path in ("/metrics", "/metrics/targets", "/metrics/engine?replica=r0"):
                assert (await api.get(path)).status_code == status, (path, metrics_auth)
            keyed = await api.get("/metrics/engine?replica=r0",
                                  headers={"authorization": "Bearer k"})
            assert keyed.status_code == 200
