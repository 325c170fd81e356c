"""A service started for one command (`score --serve`, `demo`): a child `grm-service serve`.

It runs in its own session so that its replicas are never hit by the terminal's Ctrl-C before
the gateway can stop them in order; we stop the gateway with SIGTERM and it stops its replicas.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from grm_service import config_parsers

log = logging.getLogger(__name__)


class ServiceStartFailed(RuntimeError):
    """The command's own service exited or was not ready in time; the message ends with its
    log's last lines."""


@dataclass(frozen=True)
class ServeSpec:
    model: str
    work_dir: Path
    replicas: int = 2
    engine: str | None = "vllm-cpu"  # None: the child `serve` picks (GRM_ENGINE, else auto)
    dtype: str = "float32"
    max_model_len: int | None = 512
    engine_args: tuple[str, ...] = ("--enforce-eager",)
    env: dict[str, str] = field(default_factory=dict)
    seed: int | None = None  # None: the child's own (GRM_SEED, else the default)

    def flags(self) -> list[str]:
        """What the service runs, not where it listens or keeps its files."""
        argv = ["--model", self.model, "--replicas", str(self.replicas), "--dtype", self.dtype]
        if self.engine:
            argv += ["--engine", self.engine]
        if self.max_model_len:
            argv += ["--max-model-len", str(self.max_model_len)]
        if self.seed is not None:
            argv += ["--seed", str(self.seed)]
        return argv

    def argv(self, port: int) -> list[str]:
        return [sys.executable, "-m", "grm_service.cli", "serve", *self.flags(),
                "--host", "127.0.0.1", "--port", str(port), "--work-dir", str(self.work_dir),
                "--", *self.engine_args]

    def api_key(self) -> str | None:
        """A key the child accepts, where its environment sets any (`GRM_API_KEYS`,
        `GRM_API_KEYS_FILE`): the command's own requests, readiness included, send it."""
        env = {**os.environ, **self.env}
        given = config_parsers.split_csv(env.get("GRM_API_KEYS", ""))
        file = env.get("GRM_API_KEYS_FILE")
        try:
            keys = config_parsers.api_keys(given if isinstance(given, list) else [],
                                           Path(file) if file else None)
        except OSError:
            return None  # the child refuses to start, and says why
        return keys[0] if keys else None

    def command_line(self, port: int = 8000) -> str:
        """The `grm-service serve` that runs this service by hand, in a work dir of its own."""
        return shlex.join(["grm-service", "serve", *self.flags(), "--port", str(port),
                           "--", *self.engine_args])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


# Told where a start is (`describe`) and for how long it has run (seconds), at each look.
Report = Callable[[str, float], None]


def describe(replicas: list[dict[str, Any]] | None) -> str:
    """Where a start is: the gateway not answering yet, or each replica's state."""
    if replicas is None:
        return "starting the gateway"
    ready = sum(r.get("state") == "ready" for r in replicas)
    states = ", ".join(f"{r.get('name', '?')} {r.get('state', '?')}" for r in replicas)
    return f"replicas ready: {ready}/{len(replicas)} ({states})"


def _replicas(http: httpx.Client, url: str, api_key: str | None = None
              ) -> list[dict[str, Any]] | None:
    """The replicas /ready lists (to a keyed service's asker only), None while the gateway
    does not answer."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
        replicas = http.get(url + "/ready", headers=headers, timeout=5).json()["replicas"]
        return [r for r in replicas if isinstance(r, dict)]
    return None


def wait_ready(url: str, proc: subprocess.Popen[bytes], log_path: Path, timeout: float,
               report: Report | None = None, http: httpx.Client | None = None,
               interval_s: float = 1.0, api_key: str | None = None) -> None:
    """Until every replica is ready; `report` is told where the start is at each look."""
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        client = http if http is not None else stack.enter_context(httpx.Client())
        while time.monotonic() - started < timeout:
            if proc.poll() is not None:
                raise ServiceStartFailed(
                    f"service exited with {proc.returncode}:\n{_tail(log_path)}")
            # /ready is 200 with one replica up; a run wants every replica serving.
            replicas = _replicas(client, url, api_key)
            if replicas and all(r.get("state") == "ready" for r in replicas):
                return
            if report is not None:
                report(describe(replicas), time.monotonic() - started)
            time.sleep(interval_s)
    raise ServiceStartFailed(f"service not ready after {timeout:.0f} s:\n{_tail(log_path)}")


def stop(proc: subprocess.Popen[bytes], grace_s: float = 90.0) -> None:
    """SIGTERM the gateway (it drains and stops its replicas); SIGKILL its group if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        log.warning("service %d did not stop in %.0f s: killing its group", proc.pid, grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@contextlib.contextmanager
def local_service(spec: ServeSpec, timeout: float = 900.0,
                  report: Report | None = None) -> Iterator[str]:
    """Start the service, yield its URL once ready, stop it on the way out; `report` is told
    how the start goes (`wait_ready`)."""
    spec.work_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = spec.work_dir / "gateway.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(spec.argv(port), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **spec.env})
    url = f"http://127.0.0.1:{port}"
    log.info("started service pid %d on %s (log %s)", proc.pid, url, log_path)
    try:
        wait_ready(url, proc, log_path, timeout, report, api_key=spec.api_key())
        yield url
    finally:
        stop(proc)
        log.info("stopped service pid %d", proc.pid)
