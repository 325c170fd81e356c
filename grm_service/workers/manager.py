"""`serve --workers N`: N gateway processes on one port, the replicas kept in one of them.

    grm-service serve (this manager: socket, run dir, signals; serves nothing itself)
      |- worker 0: the app + the keeper (replicas, admission, canary, restarts) + the snapshot
      |            publisher (snapshot.py)
      `- workers 1..N-1: the app + a follower of the snapshot

Every worker accepts on the one listening socket the manager bound (passed by descriptor) and
serves every route. What must hold across workers lives in the run dir, a fresh private
directory removed at exit: the replica snapshot, the lock file of the replicas' gates
(shared_gate.py), and prometheus_client's multiprocess files (/metrics on any worker shows the
sum; metrics.py).

Lifecycle: a worker that dies is logged with its last output lines and started again after a
backoff (when it is the keeper's worker, the followers see every replica down until its
successor publishes). A keeper that cannot start any replica ends the service, as with one
process. SIGTERM/SIGINT drains every worker at once (in-flight requests finish, new ones get
503); the keeper's worker stops the replicas once the followers have exited, which it learns
from its end of a pipe the manager closes then. Workers run in their own process groups (a
terminal's Ctrl-C reaches the manager only, which forwards it once) and get the parent-death
signal, so none outlives the manager; the keeper's replicas go down with their worker
(reaper.py).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import IO

import uvicorn
from prometheus_client import multiprocess

from grm_service.config import Settings
from grm_service.metrics import MULTIPROCESS_ENV
from grm_service.replicas.keeper import backoff_s
from grm_service.replicas.snapshot import mark_down

log = logging.getLogger(__name__)

FATAL_EXIT = 3  # a worker's exit code for "the service cannot start": not restarted
_TAIL_LINES = 40
_TICK_S = 0.1
_EXIT_MARGIN_S = 15.0  # after the drain: closing connections, closing the lifespan


class Worker:
    """One worker process: start, poll, signal, wait, tail."""

    def __init__(self, index: int, argv: list[str], env: dict[str, str], settings_json: bytes,
                 fds: tuple[int, ...]) -> None:
        self.index = index
        self._argv, self._env, self._settings, self._fds = argv, env, settings_json, fds
        self._proc: subprocess.Popen[bytes] | None = None
        self._tail: collections.deque[bytes] = collections.deque(maxlen=_TAIL_LINES)
        self._relaying: threading.Thread | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        self._tail.clear()
        self._proc = subprocess.Popen(
            self._argv, env=self._env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True, pass_fds=self._fds)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(self._settings)  # on a pipe: the settings may hold API keys
        self._proc.stdin.close()
        self.started_at = time.monotonic()
        self._relaying = threading.Thread(target=self._relay, args=(self._proc.stdout,),
                                          daemon=True, name=f"grm-worker-{self.index}-output")
        self._relaying.start()
        log.info("worker %d started (pid %d)", self.index, self._proc.pid)

    def _relay(self, out: IO[bytes]) -> None:
        """The worker's lines go to the manager's stderr, and the last few are kept."""
        for line in out:
            self._tail.append(line)
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.buffer.write(line)
                sys.stderr.buffer.flush()
        out.close()

    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def signal(self, sig: signal.Signals) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, sig)

    def wait(self, timeout_s: float) -> int | None:
        """Its exit code, or None if it still runs after timeout_s."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait(10)

    def tail(self) -> str:
        """Its last lines; once it has exited, up to its very last one."""
        if self._relaying is not None and self.returncode() is not None:
            self._relaying.join(2.0)
        return b"".join(self._tail).decode(errors="replace")


def run_workers(settings: Settings, log_level: str) -> int:
    """Serve with `settings.workers` processes until a signal; the exit code says how it ended."""
    run_dir = Path(tempfile.mkdtemp(prefix="grm-workers-"))
    try:
        (run_dir / "metrics").mkdir()
        return Manager(settings, log_level, run_dir).run()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _bind(settings: Settings) -> socket.socket:
    config = uvicorn.Config(None, host=settings.host, port=settings.port)  # type: ignore[arg-type]
    sock = config.bind_socket()
    sock.set_inheritable(False)  # handed over explicitly (pass_fds), to workers only
    return sock


class Manager:
    """Starts the workers, restarts a dead one, and orders the shutdown (see the module doc)."""

    def __init__(self, settings: Settings, log_level: str, run_dir: Path) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self._signals = 0
        self._fatal = False
        self._sock = _bind(settings)
        self._followers_r, self._followers_w = os.pipe()
        env = {**os.environ, MULTIPROCESS_ENV: str(run_dir / "metrics")}
        payload = settings.model_dump_json().encode()
        self.workers = [self._worker(i, log_level, env, payload) for i in range(settings.workers)]
        self._due: dict[int, float] = {}  # worker index -> when to start it again
        self._crashes = [0] * settings.workers

    def _worker(self, index: int, log_level: str, env: dict[str, str], payload: bytes) -> Worker:
        argv = [sys.executable, "-m", "grm_service.workers.worker", "--index", str(index),
                "--run-dir", str(self.run_dir), "--listen-fd", str(self._sock.fileno()),
                "--parent", str(os.getpid()), "--log-level", log_level]
        fds: tuple[int, ...] = (self._sock.fileno(),)
        if index == 0:
            argv += ["--followers-fd", str(self._followers_r)]
            fds += (self._followers_r,)
        return Worker(index, argv, env, payload, fds)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self._signals += 1  # only record: the loop acts

    def run(self) -> int:
        host, port = self._sock.getsockname()[:2]
        log.info("serving on http://%s:%d with %d workers (run dir %s)", host, port,
                 len(self.workers), self.run_dir)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for worker in self.workers:
            worker.start()
        try:
            while not self._signals and not self._fatal:
                self._tick()
                time.sleep(_TICK_S)
        finally:
            self._shutdown()
        return 1 if self._fatal else 0

    def _tick(self) -> None:
        now = time.monotonic()
        for worker in self.workers:
            if worker.index in self._due:
                if now >= self._due[worker.index]:
                    del self._due[worker.index]
                    worker.start()
                continue
            code = worker.returncode()
            if code is not None:
                self._died(worker, code, now)

    def _died(self, worker: Worker, code: int, now: float) -> None:
        assert worker.pid is not None
        # Its live gauges (in flight, replica up) leave the sums; its counters stay in them.
        multiprocess.mark_process_dead(worker.pid, str(self.run_dir / "metrics"))  # type: ignore[no-untyped-call]
        if code == FATAL_EXIT:
            log.error("worker %d could not start the service; stopping", worker.index)
            self._fatal = True
            return
        if worker.index == 0:
            mark_down(self.run_dir / "replicas.json", "the keeper's worker is restarting")
        stable = now - worker.started_at >= self.settings.restart_stable_s
        self._crashes[worker.index] = 1 if stable else self._crashes[worker.index] + 1
        delay = backoff_s(self._crashes[worker.index], 1.0, self.settings.restart_backoff_max_s)
        log.error("worker %d (pid %d) exited (%d); starting it again in %.0f s; last lines:\n%s",
                  worker.index, worker.pid, code, delay, worker.tail())
        self._due[worker.index] = now + delay

    def _shutdown(self) -> None:
        """Drain all at once; followers out first, then the keeper's worker stops the replicas."""
        drain = self.settings.drain_timeout_s + _EXIT_MARGIN_S
        log.info("stopping: every worker drains (up to %.0f s)", self.settings.drain_timeout_s)
        for worker in self.workers:
            worker.signal(signal.SIGTERM)
        for worker in self.workers[1:]:
            self._wait_or_kill(worker, drain)
        os.close(self._followers_w)
        self._wait_or_kill(self.workers[0], drain + self.settings.shutdown_grace_s)
        os.close(self._followers_r)
        self._sock.close()

    def _wait_or_kill(self, worker: Worker, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        forwarded = self._signals
        while worker.returncode() is None and time.monotonic() < deadline:
            if self._signals > forwarded:  # a second Ctrl-C: the workers skip their drain too
                forwarded = self._signals
                for each in self.workers:
                    each.signal(signal.SIGTERM)
            worker.wait(_TICK_S)
        if worker.returncode() is None:
            log.error("worker %d did not exit within %.0f s: killed", worker.index, timeout_s)
            worker.kill()
