"""Start, watch and stop the processes a benchmark needs, and the paths they share.

Every process is started by us and stopped by pid (SIGTERM to its group, grace, SIGKILL) when
the `Fleet` closes, even on Ctrl-C.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import cpu

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
MAIN_PY = REPO / ".venv" / "bin" / "python"
PEERS_BIN = REPO / "benchmarks" / ".venv-peers" / "bin"
LOG_DIR = Path(os.environ.get("BENCH_LOG_DIR", "/tmp/grm-bench-logs"))
# The stub's default served model name (its /v1/models): smg routes by it and grm-service checks
# it, so every contender is sent this name.
STUB_MODEL = "rm"


def pythonpath(first: Path | str) -> str:
    """`first` (the checkout, or a folder holding another `grm_service`), then the caller's
    PYTHONPATH (a device machine's extra dependencies)."""
    return os.pathsep.join(p for p in (str(first), os.environ.get("PYTHONPATH", "")) if p)


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
        return cpu.cpu_seconds(self.pid)

    def user_system(self) -> tuple[float, float]:
        return cpu.user_system_seconds(self.pid)

    def stop(self) -> None:
        _stop(self.popen)

    def kill(self) -> None:
        """SIGKILL, as a crash: the process's group, then reaped."""
        kill_group(self.pid)
        self.popen.wait()

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


def kill_group(pid: int) -> None:
    """SIGKILL a process group (a replica's pid leads its own: its engine and workers too)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


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


def wait_for(ready: Callable[[], bool], what: str, timeout: float, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(every)
    raise RuntimeError(f"not {what} after {timeout:.0f} s")
