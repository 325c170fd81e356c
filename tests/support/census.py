"""A pytest plugin that counts the vLLM engines a run starts, per test module.

Engines are found the way an operator would find them: by reading /proc. Every engine this
project starts (launched by a gateway, a `grm-service backend`, a Ray actor or a plain vLLM
server in a test) runs one of the entry points below, below the pytest process, and lives for
tens of seconds at least, so a scan every half second sees each one. The table is printed at
the end of the session (under xdist, each worker counts its own and sends the counts to the
controller).
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

import pytest

ENTRY_POINTS = (b"vllm.entrypoints.openai.api_server", b"vllm.entrypoints.cli.main")
PERIOD_S = 0.5
OUTPUT_KEY = "grm_engine_starts"


def _engine_pids() -> set[int]:
    """The root process of every engine below this one (forked helpers keep their parent's argv;
    engines of other runs on the machine are not this run's)."""
    parents: dict[int, int] = {}
    engines: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents[int(entry.name)] = ppid
        if any(point in arg for arg in argv[:4] for point in ENTRY_POINTS):
            engines.add(int(entry.name))
    return {pid for pid in engines
            if parents.get(pid) not in engines and _below(pid, os.getpid(), parents)}


def _below(pid: int, ancestor: int, parents: dict[int, int]) -> bool:
    seen = set()
    while pid in parents and pid not in seen:
        seen.add(pid)
        pid = parents[pid]
        if pid == ancestor:
            return True
    return False


class EngineCensus:
    def __init__(self) -> None:
        self.module = "(collection)"
        self.seen: set[int] = set()
        self.starts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._scan, name="engine-census", daemon=True)

    def start(self) -> None:
        self.seen = _engine_pids()  # engines running before the session are not its starts
        self._thread.start()

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._stop.set()
        self._thread.join(5)
        self._count()

    def _count(self) -> None:
        new = _engine_pids() - self.seen
        self.seen |= new
        if new:
            self.starts[self.module] += len(new)

    def _scan(self) -> None:
        while not self._stop.wait(PERIOD_S):
            self._count()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item):  # type: ignore[no-untyped-def]
        self._count()  # whatever started before this item belongs to the one before
        self.module = item.nodeid.split("::")[0]
        yield
        self._count()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: object, error: object) -> None:
        """xdist's controller: a worker's counts, sent at its session's end."""
        output = getattr(node, "workeroutput", {})
        self.starts.update(output.get(OUTPUT_KEY, {}))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: its counts go to the controller
            self.stop()
            workeroutput[OUTPUT_KEY] = dict(self.starts)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        self.stop()
        total = sum(self.starts.values())
        terminalreporter.section(f"vLLM engine starts: {total}")
        for module, count in sorted(self.starts.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{count:4d}  {module}")


def _xdist_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", 0))


def pytest_configure(config: pytest.Config) -> None:
    census = EngineCensus()
    if not _xdist_controller(config):  # the controller runs no test: its workers count
        census.start()
    config.pluginmanager.register(census, "engine-census")
