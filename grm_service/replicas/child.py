"""One replica's engine process tree, run under `grm_service.replicas.reaper` in its own process
group.

Used by the local launcher (in the gateway) and by the Ray actor (on its node): the argv and env
come from the engine profile's recipe, output goes to a log file whose tail is shown when the
replica dies, and the launching process holds the write end of the reaper's lifeline, so the
engine's whole group goes down with its launcher (a SIGKILLed gateway, a killed Ray actor).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from grm_service.engines import ChildCommand

log = logging.getLogger(__name__)

_TAIL_LINES = 40


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now (the engine binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        with path.open("rb") as fh:
            return b"".join(deque(fh, maxlen=lines)).decode(errors="replace")
    except OSError:
        return "(no log)"


class ReapedProcess:
    """start, returncode, stop, tail, pid: the verbs every launcher needs, nothing more."""

    def __init__(self, command: ChildCommand, log_path: Path, scratch: Path | None = None) -> None:
        self.command = command
        self.log_path = log_path
        self._scratch = scratch  # removed after stop: the engine leaves its IPC sockets there
        self._proc: subprocess.Popen[bytes] | None = None
        self._lifeline: int | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        self.command.make_dirs()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        read_end, self._lifeline = os.pipe()
        with self.log_path.open("ab") as out:
            out.write(f"\n--- start {time.strftime('%F %T')}: "
                      f"{' '.join(self.command.argv)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "grm_service.replicas.reaper", "--lifeline", str(read_end),
                 "--", *self.command.argv],
                env=self.command.env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(read_end,),
            )
        os.close(read_end)

    def returncode(self) -> int | None:
        """None while running (or never started)."""
        return self._proc.poll() if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def tail(self) -> str:
        return log_tail(self.log_path)

    def stop(self, grace_s: float) -> int | None:
        """Blocking: SIGTERM the group, wait up to grace, SIGKILL the group, reap."""
        if self._proc is None:
            return None
        self._signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(grace_s)
        self._signal(signal.SIGKILL)
        code = self._proc.wait()
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        return code

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, sig)
