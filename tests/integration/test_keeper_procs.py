"""The keeper with real processes: garbage-answering replicas and a replica that cannot start,
all STUB backends (the thing under test is the gateway's monitor, not an engine).

Every wait is for an event, bounded by a generous deadline that no passing run comes near; the
one time bound asserted (how soon a killed replica is noticed) derives from the configured health
interval."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grm_service.config import Settings
from grm_service.engines import ReplicaSpec
from grm_service.metrics import Metrics
from grm_service.replicas.admission import Admission
from grm_service.replicas.keeper import _PROBE_TIMEOUT_S, Keeper
from grm_service.replicas.sources import LocalSource
from tests.support.procs import Proc, pids_alive, start_gateway, start_stub
from tests.support.stub_engine import StubEngine

HEALTH_INTERVAL_S = 0.5
# A deadline for things that happen in seconds; only a broken run waits this long.
DEADLINE_S = 120.0
# Three held probes of the hanging replica: at least two whole probe timeouts went by.
HANG_PROBES = 3


def states(gw: Proc) -> dict[str, tuple[str, str]]:
    ready = httpx.get(gw.url + "/ready", timeout=10).json()
    return {r["name"]: (r["state"], r["detail"]) for r in ready["replicas"]}


def wait_for(gw: Proc, name: str, want: set[str], timeout: float = DEADLINE_S) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        assert gw.popen.poll() is None, gw.tail()
        with contextlib.suppress(httpx.HTTPError):
            if states(gw)[name][0] in want:
                return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"{name} never reached {want}: {states(gw)}\n{gw.tail()}")


def held_probes(hang: Proc) -> int:
    """Health probes the `--garbage hang` STUB has received (and never answered)."""
    return hang.log.read_text(errors="replace").count("hang: holding GET /health")


def watch_garbage(gw: Proc, hang: Proc) -> dict[str, tuple[str, str]]:
    """Every sample: the good replicas serve, the garbage ones do not. Until the garbage ones
    are refused for what they answer and the hanging one's probes have timed out repeatedly."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        now = states(gw)
        assert now["r0"][0] == now["r1"][0] == "ready", now
        assert all(now[name][0] != "ready" for name in ("r2", "r3", "r4")), now
        refused = all(now[n][0] == "rejected" and "JSON" in now[n][1] for n in ("r2", "r3"))
        if refused and now["r4"][0] == "down" and held_probes(hang) >= HANG_PROBES:
            return now
        assert time.monotonic() < deadline, f"{now}, {held_probes(hang)} probes held"
        time.sleep(0.2)


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
    urls = [a for s in stubs for a in ("--replica-url", s.url)]
    env = {"GRM_HEALTH_INTERVAL_S": str(HEALTH_INTERVAL_S)}
    gw = start_gateway(tmp_path, *urls, "--served-model-name", "rm", env=env)
    try:
        wait_for(gw, "r1", {"ready"})
        now = watch_garbage(gw, stubs[4])
        assert "health check: bad" in now["r4"][1], now
        port = stubs[1].url.rsplit(":", 1)[1]
        stubs[1].stop()  # killed
        took = wait_for(gw, "r1", {"down", "restarting"})
        # Nothing listens: down at the first probe after the kill, not after misses pile up.
        detail = states(gw)["r1"][1]
        assert "refused" in detail and "in a row" not in detail, detail
        # The next probe comes within one health interval and a refused connect is immediate;
        # the margin is one probe timeout, so the hanging replica's probes never delay r1's.
        assert took < HEALTH_INTERVAL_S + _PROBE_TIMEOUT_S, took
        stubs[1] = start_stub(tmp_path, "--port", port)  # back at the same address
        wait_for(gw, "r1", {"ready"})
        r = httpx.post(gw.url + "/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "still served"}]})
        assert r.status_code == 200, r.text
    finally:
        gw.stop()


class BrokenStub(StubEngine):
    """A replica that cannot start: the STUB exits at once (2) on an unknown flag."""

    def argv(self, spec: ReplicaSpec, host: str) -> list[str]:
        return [*super().argv(spec, host), "--no-such-engine-flag"]


async def test_a_replica_that_cannot_start_does_not_stop_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(model="stub", served_model_name="rm", work_dir=tmp_path,
                        startup_timeout_s=300, canary=False)
    client = httpx.AsyncClient()
    keeper = Keeper(settings, Metrics(),
                    [LocalSource(StubEngine(settings), 0), LocalSource(BrokenStub(settings), 1)],
                    Admission(settings, client), client)
    caplog.set_level(logging.ERROR, logger="grm_service.replicas.keeper")
    try:
        await asyncio.wait_for(keeper.start(), DEADLINE_S)  # serves on the good one
        good, failing = keeper.pool.replicas
        assert good.state.value == "ready"
        deadline = time.monotonic() + DEADLINE_S
        while "no-such-engine-flag" not in caplog.text and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert failing.state.value in ("down", "restarting", "starting", "checking")
        assert "replica r1 exited" in caplog.text and "no-such-engine-flag" in caplog.text
        assert failing.detail.startswith("replica r1 exited")
        assert good.state.value == "ready"
        pids = [pid for pid in (good.pid, failing.pid) if pid is not None]
    finally:
        await keeper.stop()
        await client.aclose()
    assert pids and not pids_alive(pids), "stop leaves no replica process behind"
