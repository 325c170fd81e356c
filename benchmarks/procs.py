"""Start, watch and stop the processes a benchmark needs: stubs, gateways, peers.

Standard library only, so any interpreter can run the harness. Every process is started by us and
stopped by pid (SIGTERM, grace, SIGKILL) when the `Fleet` closes, even on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAIN_PY = REPO / ".venv" / "bin" / "python"
PEERS_BIN = REPO / "benchmarks" / ".venv-peers" / "bin"
LOG_DIR = Path(os.environ.get("BENCH_LOG_DIR", "/tmp/grm-bench-logs"))
# The stub's default served model name (its /v1/models): smg routes by it and grm-service checks
# it, so every contender is sent this name.
STUB_MODEL = "rm"
_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def http_post_json(url: str, body: dict[str, object], headers: dict[str, str] | None = None,
                   timeout: float = 60.0) -> tuple[int, dict[str, object]]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"content-type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, json.loads(resp.read())


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (index 1 the ppid, 11 and 12 utime and
    stime in ticks, 19 the start time); OSError where the process has gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def user_system_seconds(pid: int) -> tuple[float, float]:
    """utime and stime of a process (all its threads) and of its live descendants, in one pass:
    the kernel's share (system calls, the sockets' copies and TCP) apart."""
    user = system = 0.0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat_fields(p)
            user, system = user + int(fields[11]) / _TICKS, system + int(fields[12]) / _TICKS
    return user, system


def cpu_seconds(pid: int, reaped: bool = False, alone: bool = False) -> float:
    """utime+stime of a process (all its threads) and of its live descendants (`alone`: not
    them); `reaped`: plus what each of them has waited for of its exited children
    (cutime+cstime)."""
    columns = (11, 12, 13, 14) if reaped else (11, 12)
    total = 0.0
    for p in [pid, *([] if alone else descendants(pid))]:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat_fields(p)
            total += sum(int(fields[i]) for i in columns) / _TICKS
    return total


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(stat_fields(int(entry.name))[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def user_system(self) -> tuple[float, float]:
        return user_system_seconds(self.pid)

    def stop(self) -> None:
        _stop(self.popen)

    def tail(self, n: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return ""


@dataclass
class Fleet:
    """Every process of one benchmark run; `close()` stops them all, newest first."""

    procs: list[Proc] = field(default_factory=list)

    def spawn(self, name: str, argv: list[str], url: str,
              env: dict[str, str] | None = None) -> Proc:
        # cwd outside the checkout: `python -m` puts cwd first on sys.path, which would shadow a
        # patched package given through PYTHONPATH.
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        log = LOG_DIR / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
                                     start_new_session=True, cwd=LOG_DIR)
        proc = Proc(name, popen, url, log)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in reversed(self.procs):
            _stop(proc.popen)
        self.procs.clear()


def _stop(popen: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    if popen.poll() is not None:
        return
    # Each child leads its own session: signal the group, so helpers it forked die too.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGTERM)
    try:
        popen.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()


@contextlib.contextmanager
def fleet() -> Iterator[Fleet]:
    f = Fleet()
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield f
    finally:
        f.close()
        signal.signal(signal.SIGTERM, previous)


def wait_ready(proc: Proc, path: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")
        if http_get(proc.url + path)[0] == 200:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{proc.name} not ready after {timeout:.0f}s:\n{proc.tail()}")


def start_stub(f: Fleet, index: int, delay: float = 0.0, fast: bool = False) -> Proc:
    port = free_port()
    # The project's stub app, bound so that TCP_NODELAY applies (stub_server.py says why).
    argv = [str(MAIN_PY), str(REPO / "benchmarks" / "stub_server.py"), "--port", str(port)]
    if delay:
        argv += ["--delay", str(delay)]
    if fast:
        argv.append("--fast")
    proc = f.spawn(f"stub{index}", argv, f"http://127.0.0.1:{port}",
                   env={"PYTHONPATH": str(REPO)})
    wait_ready(proc, "/health")
    return proc


def start_grm(f: Fleet, backends: list[str], name: str = "grm-service",
              src: Path | None = None, extra: list[str] | None = None,
              env_extra: dict[str, str] | None = None) -> Proc:
    """grm-service in attach mode. `src`: a folder holding another `grm_service` package (a
    patched copy, to measure a proposed change) that is imported instead of the checkout's.
    Each one keeps its ledger (and the rest of its work dir) in a folder of its own."""
    port = free_port()
    argv = [str(MAIN_PY), "-m", "grm_service.cli", "serve", "--port", str(port),
            "--served-model-name", STUB_MODEL, "--log-level", "warning", "--serialize", "off",
            "--work-dir", str(LOG_DIR / f"work-{name}-{port}")]
    for url in backends:
        argv += ["--replica-url", url]
    env = {"PYTHONPATH": str(src or REPO), **(env_extra or {})}
    proc = f.spawn(name, argv + (extra or []), f"http://127.0.0.1:{port}", env=env)
    wait_ready(proc, "/ready")
    return proc


def start_lean(f: Fleet, backends: list[str]) -> Proc:
    """lean_proxy.py: the deterministic work of an answer and nothing else (its docstring)."""
    port = free_port()
    argv = [str(MAIN_PY), str(REPO / "benchmarks" / "lean_proxy.py"), "--port", str(port)]
    for url in backends:
        argv += ["--backend-url", url]
    proc = f.spawn("lean-proxy", argv, f"http://127.0.0.1:{port}")
    wait_ready(proc, "/health")
    return proc


def start_floor(f: Fleet, backend: str) -> Proc:
    """byte_floor.py: a large body's byte work (copies, crc32, blake3, base64) and nothing else."""
    port = free_port()
    argv = [str(MAIN_PY), str(REPO / "benchmarks" / "byte_floor.py"), "--port", str(port),
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
    _wait_smg_workers(proc, len(backends))
    return proc


def _wait_smg_workers(proc: Proc, n: int, timeout: float = 30.0) -> None:
    """smg answers /health before its workers are registered (that runs in the background)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, raw = http_get(proc.url + "/workers")
        with contextlib.suppress(ValueError):
            if status == 200 and len(json.loads(raw).get("workers", [])) >= n:
                return
        time.sleep(0.2)
    raise RuntimeError(f"smg did not register {n} workers:\n{proc.tail()}")
