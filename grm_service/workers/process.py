"""One child process of the manager (a serving worker or the keeper): start, poll, ping, signal,
wait, tail.

The liveness ping goes over a socket pair made afresh at each start: the manager writes one byte,
the child's event loop writes it back (`gateway.role.WorkerRole.answer_pings`). A pong proves what
a living pid does not: that the process runs and its event loop turns, so a worker stopped by a
signal, dead-locked or stuck in a loop that never yields is told apart from a busy one.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO

log = logging.getLogger(__name__)

_TAIL_LINES = 40
PING = b"p"


class ChildProcess:
    """The handle of one child; `name` is how the log calls it ("worker 1", "keeper")."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], settings_json: bytes,
                 fds: tuple[int, ...], pinged: bool) -> None:
        self.name = name
        self._argv, self._env, self._settings, self._fds = argv, env, settings_json, fds
        self._pinged = pinged
        self._proc: subprocess.Popen[bytes] | None = None
        self._tail: collections.deque[bytes] = collections.deque(maxlen=_TAIL_LINES)
        self._relaying: threading.Thread | None = None
        self._ping: socket.socket | None = None  # the manager's end
        self.started_at = 0.0
        self.ping_sent: float | None = None  # when the unanswered ping went out
        self.answered_at: float | None = None  # its last pong

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        self._tail.clear()
        argv, fds, theirs = list(self._argv), self._fds, None
        if self._pinged:
            self._close_ping()
            self._ping, theirs = socket.socketpair()
            self._ping.setblocking(False)
            argv += ["--ping-fd", str(theirs.fileno())]
            fds += (theirs.fileno(),)
        try:
            self._proc = subprocess.Popen(
                argv, env=self._env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True, pass_fds=fds)
        finally:
            if theirs is not None:
                theirs.close()  # the child has its own copy
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(self._settings)  # on a pipe: the settings may hold API keys
        self._proc.stdin.close()
        self.started_at, self.ping_sent, self.answered_at = time.monotonic(), None, None
        self._relaying = threading.Thread(target=self._relay, args=(self._proc.stdout,),
                                          daemon=True, name=f"grm-{self.name}-output")
        self._relaying.start()
        log.info("%s started (pid %d)", self.name, self._proc.pid)

    def _relay(self, out: IO[bytes]) -> None:
        """The child's lines go to the manager's stderr, and the last few are kept."""
        for line in out:
            self._tail.append(line)
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.buffer.write(line)
                sys.stderr.buffer.flush()
        out.close()

    def ping(self, now: float, interval_s: float) -> None:
        """Read any pong; send the next ping once the last was answered `interval_s` ago."""
        if self._ping is None:
            return
        with contextlib.suppress(BlockingIOError, ConnectionError):
            if self._ping.recv(64):
                self.ping_sent, self.answered_at = None, now
        if self.ping_sent is None and now - (self.answered_at or 0.0) >= interval_s:
            with contextlib.suppress(BlockingIOError, ConnectionError):
                self._ping.send(PING)
                self.ping_sent = now

    def unanswered_s(self, now: float) -> float:
        """How long its oldest ping has gone unanswered (0: none outstanding)."""
        return 0.0 if self.ping_sent is None else now - self.ping_sent

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

    def kill(self) -> int | None:
        self.signal(signal.SIGKILL)
        return self.wait(10)

    def tail(self) -> str:
        """Its last lines; once it has exited, up to its very last one."""
        if self._relaying is not None and self.returncode() is not None:
            self._relaying.join(2.0)
        return b"".join(self._tail).decode(errors="replace")

    def _close_ping(self) -> None:
        if self._ping is not None:
            self._ping.close()
            self._ping = None

    def close(self) -> None:
        self._close_ping()
