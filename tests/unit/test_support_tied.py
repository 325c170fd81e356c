"""tests/support/tied.py: the suite's shared engines end with the test process that started them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A test process in miniature: starts a tied command, says its pid, waits for a line, exits.
STARTER = (
    "import subprocess, sys\n"
    "from tests.support.tied import tie\n"
    "child = subprocess.Popen(tie(['/bin/sleep', '60']), start_new_session=True)\n"
    "print(child.pid, flush=True)\n"
    "sys.stdin.readline()\n"
)


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_tied_command_is_itself_and_ends_with_the_process_that_started_it() -> None:
    with subprocess.Popen([sys.executable, "-c", STARTER], cwd=REPO, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as starter:
        assert starter.stdin is not None and starter.stdout is not None
        pid = int(starter.stdout.readline())
        try:
            # The pid the test holds is the command's (exec), not a wrapper's.
            assert _cmdline(pid, b"/bin/sleep")[:2] == [b"/bin/sleep", b"60"]
            assert not _gone(pid, 0.2)
            starter.stdin.write("\n")
            starter.stdin.flush()
            assert starter.wait(10) == 0
            # Its own session: no signal of the starter's group reached it, the kernel's did.
            assert _gone(pid, 10), "the tied command outlived the process that started it"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if starter.poll() is None:
                starter.kill()


def _cmdline(pid: int, program: bytes) -> list[bytes]:
    """The process's argv once it runs `program` (the wrapper execs into it)."""
    deadline = time.monotonic() + 10
    cmdline = b""
    while time.monotonic() < deadline and not cmdline.startswith(program):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        time.sleep(0.02)
    return cmdline.split(b"\0")
