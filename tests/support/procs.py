"""Real processes for tests: the gateway CLI and the stub backend, each in its own group."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.tied import tie

log = logging.getLogger(__name__)


def gone_pid() -> int:
    """The pid of a process that has ended (a child run and waited for): an owner that is gone."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 60) -> int:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("pid %d still running %.0f s after %s: SIGKILLed", self.popen.pid,
                        timeout, sig.name)
            os.killpg(self.popen.pid, signal.SIGKILL)
            return self.popen.wait(10)
        finally:
            if self.popen.stdout:
                self.popen.stdout.close()

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def start_stub(tmp: Path, *args: str) -> Proc:
    log = tmp / f"stub-{time.monotonic_ns()}.log"
    with log.open("wb") as err:
        popen = subprocess.Popen(
            [sys.executable, "-m", "grm_service.testing.stub_openai", *args],
            stdout=subprocess.PIPE, stderr=err, start_new_session=True,
        )
    assert popen.stdout is not None
    line = popen.stdout.readline().decode()
    assert line.startswith("PORT "), f"stub did not start: {line!r}"
    return Proc(popen, f"http://127.0.0.1:{int(line.split()[1])}", log)


def start_gateway(tmp: Path, *args: str, env: dict[str, str] | None = None,
                  tied: bool = False, work_dir: bool = True) -> Proc:
    """`tied`: SIGTERM once this process is gone (`tied.py`: start it from the main thread).
    `work_dir`: a work dir of its own in `tmp`; else the service picks (its default)."""
    port = free_port()
    log = tmp / f"gateway-{port}.log"
    argv = [sys.executable, "-m", "grm_service.cli", "serve", "--port", str(port),
            *(["--work-dir", str(tmp / f"work-{port}")] if work_dir else []), *args]
    if tied:
        argv = tie(argv)
    with log.open("wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, env={**os.environ, **(env or {})})
    return Proc(popen, f"http://127.0.0.1:{port}", log)


def _all_ready(proc: Proc, headers: dict[str, str]) -> bool:
    """/ready is 200 once one replica serves; tests want every replica admitted (its replica
    states are shown only with a key, when keys are set)."""
    with contextlib.suppress(httpx.HTTPError, ValueError):
        r = httpx.get(proc.url + "/ready", timeout=5, headers=headers)
        states = {rep["state"] for rep in r.json().get("replicas", [])}
        return r.status_code == 200 and states <= {"ready", "rejected"}
    return False


def wait_ready(proc: Proc, timeout: float, key: str | None = None) -> None:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise AssertionError(f"gateway exited {proc.popen.returncode}:\n{proc.tail()}")
        if _all_ready(proc, headers):
            return
        time.sleep(0.5)
    raise AssertionError(f"gateway not ready after {timeout} s:\n{proc.tail()}")


@contextlib.contextmanager
def running_gateway(
    tmp: Path, *args: str, timeout: float = 600, env: dict[str, str] | None = None,
    stop_timeout: float = 60,
) -> Iterator[Proc]:
    """A gateway for the `with` block; stopped by SIGTERM, SIGKILLed after `stop_timeout` s (a
    SIGKILLed process leaves no coverage data)."""
    proc = start_gateway(tmp, *args, env=env)
    keys = (env or {}).get("GRM_API_KEYS", "")
    try:
        wait_ready(proc, timeout, keys.split(",")[0].strip() or None)
        yield proc
    finally:
        proc.stop(timeout=stop_timeout)


# A deadline for waits on things that take seconds: only a broken run comes near it, so it can
# be generous for a loaded machine.
DEADLINE_S = 120.0


def wait_until(check: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    """Poll `check` until it holds; fail naming `what` after `timeout` s. HTTP errors count as
    not yet (the process asked may be starting or stopping)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if check():
                return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(pid)
    return alive


def descendants(pid: int) -> list[int]:
    """Every process below pid, read from /proc (no psutil needed)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@contextlib.contextmanager
def gateway_on_stubs(
    tmp: Path, *args: str, count: int = 2, stub_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None, shared: list[Proc] | None = None,
) -> Iterator[tuple[Proc, list[Proc]]]:
    """A gateway attached to `count` STUB backends (served model "rm"), stopped after; the STUBs
    too, unless they are `shared` (the run's recording pair, whose records are cleared first)."""
    if shared is not None:
        received(shared, clear=True)
    stubs = shared if shared is not None else [start_stub(tmp, *stub_args) for _ in range(count)]
    try:
        urls = [a for s in stubs for a in ("--replica-url", s.url)]
        with running_gateway(tmp, *urls, "--served-model-name", "rm", *args,
                             timeout=60, env=env) as gateway:
            yield gateway, stubs
    finally:
        for stub in stubs if shared is None else []:
            stub.stop()


def received(stubs: list[Proc], clear: bool = False) -> list[dict[str, object]]:
    """What the recording STUBs (`--record N`) were sent, all of them together."""
    found: list[dict[str, object]] = []
    for stub in stubs:
        answer = httpx.request("DELETE" if clear else "GET", stub.url + "/stub/received")
        found += answer.json()
    return found
