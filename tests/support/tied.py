"""Run a command tied to the test process that starts it: `tie(argv)` is the argv to start.

    python tests/support/tied.py PARENT_PID ARGV...

The engines the suite shares (`engines.EnginePool`) live across tests, each in a process group
of its own, and the pool stops them when the run ends. A run stopped before its end (its
controller killed by a timeout: the xdist worker goes, its `pytest_unconfigure` never runs) left
them running, a vLLM engine each, for every later run to share the cores with. This arms the
kernel's parent-death signal, as the product's reaper does for its engines
(`grm_service.replicas.reaper.die_with_parent`), then becomes the command by exec, so the pid a
test holds, signals and inspects is the command's own.

The signal follows the thread that forked, not the process: start tied commands from the main
thread only (the pool does: pytest's hooks and fixtures).
"""

from __future__ import annotations

import os
import sys

from grm_service.replicas.reaper import die_with_parent


def tie(argv: list[str]) -> list[str]:
    """`argv` (its first item an absolute path) run by this file for the calling process."""
    return [sys.executable, os.path.abspath(__file__), str(os.getpid()), *argv]


def main(argv: list[str]) -> None:
    parent, command = int(argv[0]), argv[1:]
    die_with_parent(parent)  # SIGTERM once `parent` is gone (exits now if it already is)
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
