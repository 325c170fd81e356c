"""A replica's keeper: runs the engine and takes its whole process group down with the gateway.

The supervisor starts `python -m grm_service.replicas.reaper --lifeline FD -- ARGV...` as the
leader of a new process group and keeps the write end of a pipe whose read end is FD. The engine
and every process it spawns stay in that group. When the gateway dies for any reason, SIGKILL
included, the kernel closes the pipe; the reaper sees EOF and ends the group, so no replica is
orphaned.

The reaper itself can be SIGKILLed too: Ray kills a dead actor's child processes (the reaper)
one by one, not their groups. The engine is therefore started with the kernel's parent-death
signal: it gets SIGTERM the moment its reaper dies, and shuts its own engine processes down.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time

_GRACE_S = 10.0
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """SIGTERM this process when `parent` dies (Linux: prctl; elsewhere nothing to do). In the
    engine's process, before exec; in a gateway worker, first thing."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the reaper died before the signal was armed
        os._exit(1)


def _end_group(child: subprocess.Popen[bytes]) -> None:
    group = os.getpgid(0)
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(group, signal.SIGKILL)  # also ends this process: nothing may outlive the gateway


def _watch(lifeline: int, child: subprocess.Popen[bytes]) -> int:
    pidfd = os.pidfd_open(child.pid)
    while True:
        readable, _, _ = select.select([lifeline, pidfd], [], [])
        if pidfd in readable:
            return child.wait()
        if not os.read(lifeline, 1):
            _end_group(child)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--lifeline" or argv[2] != "--":
        sys.stderr.write("usage: python -m grm_service.replicas.reaper --lifeline FD -- ARGV...\n")
        return 2
    lifeline = int(argv[1])
    # A Python-level handler (not SIG_IGN) so the engine, after exec, gets default dispositions;
    # the supervisor's group-wide SIGTERM is for the engine, the reaper outlives it to reap.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    me = os.getpid()
    # preexec_fn is safe here: the reaper runs no other thread.
    child = subprocess.Popen(argv[3:], preexec_fn=lambda: die_with_parent(me))
    return _watch(lifeline, child)


def end_as(code: int) -> int:
    """The exit status that tells the supervisor how the engine ended. An engine killed by a
    signal (-N from `wait`) kills the reaper with the same signal, so the supervisor reads -N,
    as it would from the engine itself: `sys.exit(-9)` would say 247."""
    if code < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be set, nor need be
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal whose default is not to end a process: the shell's form
    return code


if __name__ == "__main__":
    sys.exit(end_as(main(sys.argv[1:])))
