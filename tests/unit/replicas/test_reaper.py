"""The reaper: its engine goes down with it, whether the launcher or the reaper itself dies."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from grm_service.replicas import reaper
from tests.support.procs import gone_pid


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


linux_only = pytest.mark.skipif(sys.platform != "linux", reason="prctl and pidfd are Linux's")


@linux_only
def test_engine_dies_when_its_reaper_is_sigkilled() -> None:
    """As Ray does to a dead actor's children: the reaper is killed alone, not its group."""
    read_end, write_end = os.pipe()
    reaper_proc = subprocess.Popen(
        [sys.executable, "-m", "grm_service.replicas.reaper", "--lifeline", str(read_end), "--",
         sys.executable, "-c", "import time; time.sleep(120)"],
        pass_fds=(read_end,), start_new_session=True)
    os.close(read_end)
    try:
        engine = _child_of(reaper_proc.pid)
        os.kill(reaper_proc.pid, signal.SIGKILL)
        reaper_proc.wait(10)
        deadline = time.monotonic() + 10
        while _alive(engine) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(engine), "the engine outlived its reaper"
    finally:
        os.close(write_end)
        if reaper_proc.poll() is None:
            os.killpg(reaper_proc.pid, signal.SIGKILL)


# The parent-death signal a process has armed, as `die_with_parent` arms it (prctl's
# PR_GET_PDEATHSIG), told as the exit status 100 + signal so that 1 stays `die_with_parent`'s own.
_ARMED = """
import ctypes, sys
sys.platform = {platform!r}
from grm_service.replicas.reaper import die_with_parent
die_with_parent({parent})
armed = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(armed))
sys.exit(100 + armed.value)
"""


@linux_only
@pytest.mark.parametrize(("platform", "parent_gone", "status"), [
    ("linux", False, 100 + signal.SIGTERM),  # armed with SIGTERM, and it goes on
    ("linux", True, 1),  # its parent died first: no signal would ever come, so it ends now
    ("darwin", True, 100),  # no prctl elsewhere: nothing armed, nothing ended
])
def test_a_process_arms_its_parents_death_or_ends_if_it_is_gone(
        platform: str, parent_gone: bool, status: int) -> None:
    """A process arms SIGTERM for its parent's death, or ends at once if that parent is already
    gone; off Linux it does neither."""
    parent = gone_pid() if parent_gone else os.getpid()
    script = _ARMED.format(platform=platform, parent=parent)
    assert subprocess.run([sys.executable, "-c", script], timeout=30).returncode == status


@pytest.mark.parametrize("argv", [
    [], ["--lifeline", "3", "--"], ["--lifeline", "3", "sleep", "1"], ["--fd", "3", "--", "true"],
])
def test_a_malformed_command_line_is_refused(argv: list[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Status 2 and the usage, before any handler is installed or anything started."""
    handler = signal.getsignal(signal.SIGTERM)
    assert reaper.main(argv) == 2
    assert capsys.readouterr().err.startswith("usage: python -m grm_service.replicas.reaper")
    assert signal.getsignal(signal.SIGTERM) is handler


@linux_only
@pytest.mark.parametrize(("engine", "status"), [
    ("exit 3", 3),
    # An engine killed by a signal (the kernel's OOM killer, say) reads as that signal, -9,
    # not as the 247 that `sys.exit(-9)` would make of it.
    ("kill -KILL $$", -signal.SIGKILL),
    ("kill -TERM $$", -signal.SIGTERM),  # one the reaper itself handles while it watches
])
def test_the_reaper_ends_with_its_engines_exit_status(engine: str, status: int) -> None:
    """The engine ends on its own: the reaper reports how (the replica's `exited`)."""
    read_end, write_end = os.pipe()
    try:
        reaper_run = subprocess.run(
            [sys.executable, "-m", "grm_service.replicas.reaper", "--lifeline", str(read_end),
             "--", "sh", "-c", engine], pass_fds=(read_end,), timeout=30)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert reaper_run.returncode == status


# sh with SIGTERM ignored: the disposition survives exec, so the `sleep` it becomes ignores it.
_DEAF = 'trap "" TERM; echo armed; exec sleep 60'
# An engine that dies on SIGTERM, with a child in its group that ignores it: the child says its
# pid, then "armed" once it ignores SIGTERM.
_SPAWNS_DEAF = f"sh -c 'echo $$; {_DEAF}' & wait"


def _wait_gone(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(pid), f"{pid} is still running"


@linux_only
def test_a_closed_lifeline_ends_the_engines_whole_group() -> None:
    """The launcher dies (its end of the pipe closes): the engine and what it spawned go down,
    even a process that ignores SIGTERM, and the reaper with them."""
    read_end, write_end = os.pipe()
    reaper_proc = subprocess.Popen(
        [sys.executable, "-m", "grm_service.replicas.reaper", "--lifeline", str(read_end), "--",
         "sh", "-c", _SPAWNS_DEAF],
        pass_fds=(read_end,), start_new_session=True, stdout=subprocess.PIPE)
    os.close(read_end)
    assert reaper_proc.stdout is not None
    try:
        deaf = int(reaper_proc.stdout.readline())
        assert reaper_proc.stdout.readline() == b"armed\n"
        engine_pid = _child_of(reaper_proc.pid)
        os.close(write_end)
        write_end = -1
        # Its own group's SIGKILL ends the reaper too: nothing outlives the launcher.
        assert reaper_proc.wait(30) == -signal.SIGKILL
        _wait_gone(engine_pid)
        _wait_gone(deaf)
    finally:
        if write_end >= 0:
            os.close(write_end)
        if reaper_proc.poll() is None:
            os.killpg(reaper_proc.pid, signal.SIGKILL)
            reaper_proc.wait()
        reaper_proc.stdout.close()


class _Killed(Exception):
    """The reaper's SIGKILL to its own group: in its process nothing runs after it."""


class _OwnGroup:
    """`os` as the reaper sees it from inside `group` (a sandbox, not the group running the
    tests): a call to anything not here is an AttributeError, never a signal to pytest's group."""

    read = staticmethod(os.read)

    def __init__(self, group: int) -> None:
        self.group = group
        self.pidfds: list[int] = []  # the reaper's process never closes them; this one must

    def getpgid(self, pid: int) -> int:
        assert pid == 0, "the reaper ends its own group"
        return self.group

    def killpg(self, group: int, sig: signal.Signals) -> None:
        assert group == self.group
        os.killpg(group, sig)
        if sig == signal.SIGKILL:
            raise _Killed

    def pidfd_open(self, pid: int) -> int:
        self.pidfds.append(os.pidfd_open(pid))
        return self.pidfds[-1]


Start = Callable[[list[str]], subprocess.Popen[bytes]]


@pytest.fixture
def own_group(monkeypatch: pytest.MonkeyPatch) -> Iterator[Start]:
    """`start(argv)`: the engine, leading a new group that the reaper takes for its own (the
    one it would lead); the group is killed after the test."""
    started: list[tuple[subprocess.Popen[bytes], _OwnGroup]] = []

    def start(argv: list[str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE)
        started.append((proc, _OwnGroup(proc.pid)))
        monkeypatch.setattr(reaper, "os", started[-1][1])
        return proc

    yield start
    for proc, seen in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        for fd in seen.pidfds:
            os.close(fd)


def _watch_cut(engine: subprocess.Popen[bytes]) -> int:
    """How `engine` ends when the reaper watching it finds its launcher gone (the write end of
    the lifeline closed before it looks); the reaper ends with its own SIGKILL."""
    read_end, write_end = os.pipe()
    os.close(write_end)
    try:
        with pytest.raises(_Killed):
            reaper._watch(read_end, engine)
    finally:
        os.close(read_end)
    return engine.wait(10)


@linux_only
def test_a_cut_lifeline_waits_only_for_the_engine(
        own_group: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM to the group first (the engine shuts down), then SIGKILL as soon as the engine
    is gone, not after the whole grace: what ignored SIGTERM is killed."""
    monkeypatch.setattr(reaper, "_GRACE_S", 60.0)
    engine = own_group(["sh", "-c", _SPAWNS_DEAF])
    assert engine.stdout is not None
    deaf = int(engine.stdout.readline())
    assert engine.stdout.readline() == b"armed\n"
    started = time.monotonic()
    assert _watch_cut(engine) == -signal.SIGTERM
    assert time.monotonic() - started < 30
    _wait_gone(deaf)


@linux_only
def test_an_engine_deaf_to_sigterm_is_killed_after_the_grace(
        own_group: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine ignores SIGTERM: it is given the grace, no more, then SIGKILLed."""
    monkeypatch.setattr(reaper, "_GRACE_S", 0.3)
    engine = own_group(["sh", "-c", _DEAF])
    assert engine.stdout is not None and engine.stdout.readline() == b"armed\n"
    started = time.monotonic()
    assert _watch_cut(engine) == -signal.SIGKILL
    assert time.monotonic() - started >= 0.3


@linux_only
def test_only_the_lifelines_end_reads_as_the_launchers_death(own_group: Start) -> None:
    """A byte on the lifeline is not its end: the engine runs on, and its status is returned."""
    engine = own_group(["sh", "-c", "sleep 0.2; exit 3"])
    read_end, write_end = os.pipe()
    os.write(write_end, b"x")
    try:
        assert reaper._watch(read_end, engine) == 3
    finally:
        os.close(read_end)
        os.close(write_end)
