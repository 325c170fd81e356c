"""Engine replica processes: start in parallel, wait for health, restart on crash, stop in order.

Each replica runs under `grm_service.reaper` in its own process group, with explicit argv and env
(the gateway's own environment is copied, never changed). Output goes to a log file per replica
whose tail is shown when the replica fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import httpx

from grm_service.config import Settings
from grm_service.engines import Engine, ReplicaSpec
from grm_service.errors import ConfigError
from grm_service.metrics import Metrics
from grm_service.replicas import AdmissionCheck, Replica, ReplicaPool, ReplicaState

log = logging.getLogger(__name__)

_TAIL_LINES = 40
_POLL_S = 0.5
_HEALTH_EVERY_S = 2.0
_HEALTH_FAILURES_DOWN = 3


class ReplicaStartError(ConfigError):
    """A replica did not become healthy; the message carries its log tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        with path.open("rb") as fh:
            return b"".join(deque(fh, maxlen=lines)).decode(errors="replace")
    except OSError:
        return "(no log)"


class Backend:
    """One replica's process tree: start, is_alive, terminate, kill, wait."""

    def __init__(self, engine: Engine, spec: ReplicaSpec) -> None:
        self.engine = engine
        self.spec = spec
        self.log_path = spec.work_dir / "replica.log"
        self._proc: asyncio.subprocess.Process | None = None
        self._lifeline: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.spec.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.engine.deterministic_env())
        env.update(self.engine.settings.engine_env)
        env.update(self.engine.replica_env(self.spec))
        return env

    async def start(self) -> None:
        (self.spec.work_dir / "vllm-cache").mkdir(parents=True, exist_ok=True)
        self.spec.tmp_dir.mkdir(parents=True, exist_ok=True)
        argv = self.engine.argv(self.spec)
        read_end, self._lifeline = os.pipe()
        with self.log_path.open("ab") as out:
            out.write(f"\n--- start {time.strftime('%F %T')}: {' '.join(argv)}\n".encode())
            out.flush()
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "grm_service.reaper", "--lifeline", str(read_end), "--",
                *argv, env=self.env(), stdin=asyncio.subprocess.DEVNULL, stdout=out,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True, pass_fds=(read_end,),
            )
        os.close(read_end)
        log.info("replica %s started: pid %d port %d", self.spec.name, self.pid, self.spec.port)

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc else None

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, sig)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM the group, wait up to grace, SIGKILL the group, reap."""
        if self._proc is None:
            return
        self._signal_group(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._proc.wait(), grace_s)
        self._signal_group(signal.SIGKILL)
        await self._proc.wait()
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        # The engine leaves its IPC socket files behind; they are ours to clear.
        shutil.rmtree(self.spec.tmp_dir, ignore_errors=True)
        log.info("replica %s stopped (exit %s)", self.spec.name, self._proc.returncode)


async def _healthy(client: httpx.AsyncClient, url: str) -> bool:
    try:
        response = await client.get(url + "/health", timeout=5.0)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


class Supervisor:
    """Owns the replica processes and keeps `pool` in step with them."""

    def __init__(self, settings: Settings, engine: Engine, metrics: Metrics,
                 checks: Sequence[AdmissionCheck] = ()) -> None:
        self.settings = settings
        self.checks = tuple(checks)
        self.engine = engine
        self.metrics = metrics
        self.pool = ReplicaPool()
        self._backends: dict[str, Backend] = {}
        self._client = httpx.AsyncClient()
        self._monitor: asyncio.Task[None] | None = None
        self._restarts: set[asyncio.Task[None]] = set()
        self._stopping = False

    def _spec(self, index: int) -> ReplicaSpec:
        name = f"r{index}"
        return ReplicaSpec(name=name, index=index, port=free_port(),
                           work_dir=self.settings.work_dir / name,
                           gpus=self.engine.gpu_set(index))

    async def start(self) -> None:
        """Start every replica at once; raise with the log tail if one fails to come up."""
        for index in range(self.settings.replicas):
            backend = Backend(self.engine, self._spec(index))
            self._backends[backend.spec.name] = backend
            self.pool.replicas.append(Replica(name=backend.spec.name, url=backend.url))
        started = time.monotonic()
        await asyncio.gather(*(self._launch(name) for name in self._backends))
        log.info("%d replica(s) ready in %.1f s", len(self._backends), time.monotonic() - started)
        self._monitor = asyncio.create_task(self._watch(), name="grm-supervisor")

    async def _launch(self, name: str) -> None:
        backend, replica = self._backends[name], self.pool.by_name(name)
        assert replica is not None
        replica.state = ReplicaState.STARTING
        await backend.start()
        replica.url, replica.pid = backend.url, backend.pid
        try:
            await self._wait_healthy(backend)
            await self._admit(replica)
        except ReplicaStartError:
            await backend.stop(self.settings.shutdown_grace_s)
            raise
        replica.state = ReplicaState.READY
        self.metrics.replica_up.labels(replica=name).set(1)
        log.info("replica %s ready at %s", name, backend.url)

    async def _admit(self, replica: Replica) -> None:
        """Admission checks (the canary) run before any request is routed to the replica."""
        for check in self.checks:
            problem = await check(replica, self._client)
            if problem:
                replica.state, replica.detail = ReplicaState.REJECTED, problem
                raise ReplicaStartError(f"replica {replica.name} refused: {problem}")

    async def _wait_healthy(self, backend: Backend) -> None:
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while time.monotonic() < deadline:
            if not backend.is_running():
                raise ReplicaStartError(self._failure(backend, f"exited ({backend.returncode()})"))
            if await _healthy(self._client, backend.url):
                return
            await asyncio.sleep(_POLL_S)
        limit = self.settings.startup_timeout_s
        raise ReplicaStartError(self._failure(backend, f"not healthy after {limit:.0f} s"))

    def _failure(self, backend: Backend, what: str) -> str:
        tail = log_tail(backend.log_path)
        return f"replica {backend.spec.name} {what}; log {backend.log_path}, last lines:\n{tail}"

    async def _watch(self) -> None:
        failures: dict[str, int] = {}
        while not self._stopping:
            await asyncio.sleep(_HEALTH_EVERY_S)
            for name, backend in self._backends.items():
                if self._stopping:
                    return
                await self._check(name, backend, failures)

    async def _check(self, name: str, backend: Backend, failures: dict[str, int]) -> None:
        replica = self.pool.by_name(name)
        if replica is None or replica.state is not ReplicaState.READY:
            return
        if not backend.is_running():
            log.error("%s", self._failure(backend, f"died ({backend.returncode()})"))
        else:
            ok = await _healthy(self._client, backend.url)
            failures[name] = 0 if ok else failures.get(name, 0) + 1
            if failures[name] < _HEALTH_FAILURES_DOWN:
                return
            log.error("replica %s failed %d health checks", name, failures[name])
        failures[name] = 0
        self._mark_down(replica)
        # The group may still hold engine processes after the API server died.
        await backend.stop(self.settings.shutdown_grace_s)
        task = asyncio.create_task(self._restart(name), name=f"grm-restart-{name}")
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    def _mark_down(self, replica: Replica) -> None:
        replica.state = ReplicaState.DOWN
        self.metrics.replica_up.labels(replica=replica.name).set(0)

    async def _restart(self, name: str) -> None:
        """Same seed, same argv apart from the port; backoff doubles up to its cap."""
        replica = self.pool.by_name(name)
        assert replica is not None
        while not self._stopping:
            replica.restarts += 1
            self.metrics.replica_restarts.labels(replica=name).inc()
            delay = min(2.0 ** (replica.restarts - 1), self.settings.restart_backoff_max_s)
            await asyncio.sleep(delay)
            index = int(name[1:])
            self._backends[name] = Backend(self.engine, self._spec(index))
            try:
                await self._launch(name)
                return
            except ReplicaStartError as err:
                log.error("restart of %s failed: %s", name, err.message)

    async def stop(self) -> None:
        """Ordered and bounded: stop watching, then stop every replica in parallel."""
        self._stopping = True
        for task in [*self._restarts, *([self._monitor] if self._monitor else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for replica in self.pool.replicas:
            replica.state = ReplicaState.STOPPED
        grace = self.settings.shutdown_grace_s
        await asyncio.gather(*(b.stop(grace) for b in self._backends.values()))
        await self._client.aclose()
