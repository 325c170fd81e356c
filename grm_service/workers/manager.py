"""`serve --workers N`: N serving processes on one port, the replicas kept by a process apart.

    grm-service serve (this manager: socket, run dir, signals, pings; serves nothing itself)
      |- the keeper: replicas (start or attach, admission, canaries, restarts) and the snapshot
      |              publisher (worker_side/snapshot.py); serves no request
      `- workers 0..N-1: the app + a follower of the snapshot

Why a process of its own, not the manager: a keeper is an asyncio program with an HTTP client,
canaries and (with Ray) a cluster connection, all of which can fail in ways a supervisor must
survive; and the metrics it writes need the multiprocess environment the manager only gives its
children. So the manager stays a small synchronous supervisor, and no serving worker owns an
engine: a crash on any request path restarts that worker only, while engines and admissions stay.

Every worker accepts on a listening socket the manager bound (passed by descriptor), its own
on the shared port by default (listen.py says why), and serves every route. What must hold
across processes lives in the run dir, a fresh private directory removed at exit: the replica
snapshot, the replicas' shared gates (worker_side/gates.py), and
prometheus_client's multiprocess files (/metrics on any worker shows the sum; metrics.py).

Lifecycle: each worker answers a liveness ping (process.py); one that has not answered for
`worker_ping_timeout_s` is killed. A worker that dies (or was killed) has its shared in-flight
counts released at once and is logged with its last output lines and started again after a
backoff. If the keeper dies, the workers see every replica down until its successor publishes;
a keeper that cannot start any replica ends the service, as with one process. SIGTERM/SIGINT
drains every worker at once (in-flight requests finish, new ones get 503); once they have all
exited, the keeper stops the replicas. Children run in their own process groups (a terminal's
Ctrl-C reaches the manager only, which forwards it once) and get the parent-death signal, so none
outlives the manager; the keeper's replicas go down with it (reaper.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from prometheus_client import multiprocess

from grm_service.config import Settings
from grm_service.gateway.role import gates_path, metrics_dir, snapshot_path
from grm_service.host import remove_dead_owners
from grm_service.metrics import MULTIPROCESS_ENV
from grm_service.replicas.keeper import backoff_s
from grm_service.worker_side.gates import release_worker
from grm_service.worker_side.snapshot import mark_down
from grm_service.workers.listen import listening_sockets
from grm_service.workers.process import ChildProcess

log = logging.getLogger(__name__)

FATAL_EXIT = 3  # a child's exit code for "the service cannot start": not restarted
_TICK_S = 0.1
_EXIT_MARGIN_S = 15.0  # after the drain: closing connections, closing the lifespan
_FIRST_PONG_S = 60.0  # a worker's start-up (imports, the app) before it must answer pings


_RUN_DIR_PREFIX = "grm-workers-"


def run_workers(settings: Settings, log_level: str) -> int:
    """Serve with `settings.workers` processes until a signal; the exit code says how it ended."""
    temp = Path(tempfile.gettempdir())
    for path in sweep_stale_run_dirs(temp):
        log.info("removed %s, left by a manager that is gone", path)
    try:
        sockets = listening_sockets(settings)
    except OSError as err:
        log.error("cannot listen on %s:%d: %s", settings.host, settings.port, err)
        return FATAL_EXIT
    run_dir = Path(tempfile.mkdtemp(prefix=f"{_RUN_DIR_PREFIX}{os.getpid()}-", dir=temp))
    try:
        metrics_dir(run_dir).mkdir()
        return Manager(settings, log_level, run_dir, sockets).run()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        for sock in sockets:
            sock.close()


def sweep_stale_run_dirs(folder: Path) -> list[Path]:
    """Remove the run dirs of managers that are gone (SIGKILLed: only a manager removes its
    own); their workers went with them (parent-death signal)."""
    return remove_dead_owners(folder, _RUN_DIR_PREFIX)


class Manager:
    """Starts the keeper and the workers, replaces a dead or hung one, and orders the shutdown
    (see the module doc)."""

    def __init__(self, settings: Settings, log_level: str, run_dir: Path,
                 sockets: list[socket.socket]) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self._signals = 0
        self._fatal = False
        self._port, self._listening = sockets[0].getsockname()[1], len(sockets)
        env = {**os.environ, MULTIPROCESS_ENV: str(metrics_dir(run_dir))}
        payload = settings.model_dump_json().encode()
        common = ["--run-dir", str(run_dir), "--parent", str(os.getpid()), "--log-level",
                  log_level]
        self.keeper = ChildProcess(
            "keeper", [sys.executable, "-m", "grm_service.workers.keeper_process", *common],
            env, payload, (), pinged=False)
        fds = [sockets[i % len(sockets)].fileno() for i in range(settings.workers)]
        self.workers = [ChildProcess(
            f"worker {i}", [sys.executable, "-m", "grm_service.workers.worker", "--index", str(i),
                            "--listen-fd", str(fd), *common],
            env, payload, (fd,), pinged=True) for i, fd in enumerate(fds)]
        self._children = [self.keeper, *self.workers]
        self._due: dict[str, float] = {}  # child name -> when to start it again
        self._crashes = {child.name: 0 for child in self._children}

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self._signals += 1  # only record: the loop acts

    def run(self) -> int:
        log.info("serving on http://%s:%d with %d workers on %d listening socket(s) and a keeper "
                 "(run dir %s)", self.settings.host, self._port, len(self.workers),
                 self._listening, self.run_dir)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for child in self._children:
            child.start()
        try:
            while not self._signals and not self._fatal:
                self._tick(time.monotonic())
                time.sleep(_TICK_S)
        finally:
            self._shutdown()
        return 1 if self._fatal else 0

    def _tick(self, now: float) -> None:
        for child in self._children:
            if child.name in self._due:
                if now >= self._due[child.name]:
                    del self._due[child.name]
                    child.start()
                continue
            code = child.returncode()
            if code is not None:
                self._died(child, code, now)
                continue
            starting = child.answered_at is None
            child.ping(now, self.settings.worker_ping_interval_s)
            if starting and child.answered_at is not None:
                log.info("%s (pid %s) answers its pings: a hang is caught within %g s",
                         child.name, child.pid, self.settings.worker_ping_timeout_s)
            limit = (self.settings.worker_ping_timeout_s if child.answered_at is not None
                     else max(_FIRST_PONG_S, self.settings.worker_ping_timeout_s))
            if child.unanswered_s(now) > limit:
                self._hung(child, limit, now)

    def _hung(self, child: ChildProcess, limit: float, now: float) -> None:
        log.error("%s (pid %s) has not answered a ping for %.1f s: killed", child.name,
                  child.pid, limit)
        code = child.kill()
        # A worker stopped inside a shared gate's few-instruction lock would have stalled the
        # others' loops too: once it is gone, they get a full timeout again.
        for other in self.workers:
            if other is not child and other.ping_sent is not None:
                other.ping_sent = now
        self._died(child, code if code is not None else -signal.SIGKILL, now)

    def _died(self, child: ChildProcess, code: int, now: float) -> None:
        assert child.pid is not None
        # Its live gauges (in flight, replica up) leave the sums; its counters stay in them.
        multiprocess.mark_process_dead(child.pid, str(metrics_dir(self.run_dir)))  # type: ignore[no-untyped-call]
        if child is self.keeper:
            mark_down(snapshot_path(self.run_dir), "the keeper is restarting")
        else:  # its requests are gone: the replicas' shared bounds get their slots back now
            release_worker(gates_path(self.run_dir), self.workers.index(child),
                           len(self.workers))
        if code == FATAL_EXIT:
            log.error("%s could not start the service; stopping", child.name)
            self._fatal = True
            return
        stable = now - child.started_at >= self.settings.restart_stable_s
        crashes = 1 if stable else self._crashes[child.name] + 1
        self._crashes[child.name] = crashes
        delay = backoff_s(crashes, 1.0, self.settings.restart_backoff_max_s)
        log.error("%s (pid %d) exited (%d); starting it again in %.0f s; last lines:\n%s",
                  child.name, child.pid, code, delay, child.tail())
        self._due[child.name] = now + delay

    def _shutdown(self) -> None:
        """Drain every worker at once; once they are out, the keeper stops the replicas."""
        drain = self.settings.drain_timeout_s + _EXIT_MARGIN_S
        log.info("stopping: every worker drains (up to %.0f s)", self.settings.drain_timeout_s)
        for worker in self.workers:
            worker.signal(signal.SIGTERM)
        for worker in self.workers:
            self._wait_or_kill(worker, drain)
        self.keeper.signal(signal.SIGTERM)
        self._wait_or_kill(self.keeper, self.settings.shutdown_grace_s + _EXIT_MARGIN_S)
        for child in self._children:
            child.close()

    def _wait_or_kill(self, child: ChildProcess, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        forwarded = self._signals
        while child.returncode() is None and time.monotonic() < deadline:
            if self._signals > forwarded:  # a second Ctrl-C: the workers skip their drain too
                forwarded = self._signals
                for each in self._children:
                    each.signal(signal.SIGTERM)
            child.wait(_TICK_S)
        if child.returncode() is None:
            log.error("%s did not exit within %.0f s: killed", child.name, timeout_s)
            child.kill()
