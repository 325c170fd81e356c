"""The reaper: its engine goes down with it, whether the launcher or the reaper itself dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes; its parent (init) reaps it.
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"


def _child_of(pid: int, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as fh:
                        if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                            return int(entry)
                except OSError:
                    continue
        time.sleep(0.05)
    raise AssertionError(f"no child of {pid}")


@pytest.mark.skipif(sys.platform != "linux", reason="parent-death signal is Linux's")
def test_engine_dies_when_its_reaper_is_sigkilled() -> None:
    """As Ray does to a dead actor's children: the reaper is killed alone, not its group."""
    read_end, write_end = os.pipe()
    reaper = subprocess.Popen(
        [sys.executable, "-m", "grm_service.replicas.reaper", "--lifeline", str(read_end), "--",
         sys.executable, "-c", "import time; time.sleep(120)"],
        pass_fds=(read_end,), start_new_session=True)
    os.close(read_end)
    try:
        engine = _child_of(reaper.pid)
        os.kill(reaper.pid, signal.SIGKILL)
        reaper.wait(10)
        deadline = time.monotonic() + 10
        while _alive(engine) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(engine), "the engine outlived its reaper"
    finally:
        os.close(write_end)
        if reaper.poll() is None:
            os.killpg(reaper.pid, signal.SIGKILL)
