"""Each service its own work dir: two services on one machine never share a replica log or a
ledger unless told to, and a shared one given on purpose is refused while its holder lives."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import typer

from grm_service.commands.ledger import default_location
from grm_service.config import Settings
from grm_service.errors import WorkDirBusy
from grm_service.ledger.location import open_store
from grm_service.work_dir import LOCK_FILE, claimed, run_root
from tests.support.procs import Proc, start_gateway, wait_ready

PID = os.getpid()


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The run root of services without --work-dir, in the test's own HOME."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert run_root() == tmp_path / ".cache" / "grm-service" / "run"
    return run_root()


def default(port: int) -> Settings:
    """A service without --work-dir."""
    settings = Settings(model="/m", port=port)
    assert "work_dir" not in settings.model_fields_set and settings.work_dir == run_root()
    return settings


def test_services_on_two_ports_take_two_folders(root: Path) -> None:
    with claimed(default(8000), PID) as a, claimed(default(8001), PID) as b:
        assert (a.work_dir, b.work_dir) == (root / "port-8000", root / "port-8001")
        assert a.ledger_location != b.ledger_location
        assert a.ledger_location == str(root / "port-8000" / "ledger.sqlite")


def test_a_held_folder_is_never_shared_and_is_free_again_once_let_go(root: Path) -> None:
    """flock belongs to an open file: a second claim in this process meets the first's lock as
    another process's would."""
    with claimed(default(8000), PID) as first:
        with claimed(default(8000), PID) as second:
            assert second.work_dir == root / f"port-8000-pid-{PID}"
        assert f"pid {PID}" in (first.work_dir / LOCK_FILE).read_text()
    with claimed(default(8000), PID) as again:
        assert again.work_dir == root / "port-8000"  # the same service, its ledger again


def test_a_work_dir_given_on_purpose_is_refused_while_another_holds_it(tmp_path: Path) -> None:
    given = Settings(model="/m", work_dir=tmp_path / "shared", port=8002)
    with claimed(given, PID) as held:
        assert held.work_dir == tmp_path / "shared"
        with pytest.raises(WorkDirBusy, match=rf"in use by a live service \(pid {PID}, "), \
                claimed(given.model_copy(update={"port": 8003}), PID):
            pass
    with claimed(given, PID):
        pass


def test_the_ledger_commands_find_the_one_default_ledger_and_never_guess(tmp_path: Path) -> None:
    assert default_location(tmp_path) == str(tmp_path / "ledger.sqlite")  # none yet: as before
    one = tmp_path / "port-8000" / "ledger.sqlite"
    one.parent.mkdir()
    one.write_bytes(b"")
    assert default_location(tmp_path) == str(one)
    (tmp_path / "port-8001").mkdir()
    (tmp_path / "port-8001" / "ledger.sqlite").write_bytes(b"")
    with pytest.raises(typer.BadParameter, match=r"2 services keep a ledger .* name one with"):
        default_location(tmp_path)


@pytest.fixture
def two_gateways(stub: Proc, tmp_path: Path) -> Iterator[tuple[Proc, Proc, Path]]:
    """Two real gateways on one machine, attached to the STUB replica (the gateway is under
    test), neither given a work dir: the default's run root is in the test's HOME."""
    env = {"HOME": str(tmp_path), "GRM_AUDIT_FRACTION": "0"}
    procs = [start_gateway(tmp_path, "--replica-url", stub.url, "--served-model-name", "rm",
                           env=env, work_dir=False) for _ in range(2)]
    try:
        for proc in procs:
            wait_ready(proc, 120)
        yield procs[0], procs[1], tmp_path / ".cache" / "grm-service" / "run"
    finally:
        for proc in procs:
            proc.stop()


def _port(proc: Proc) -> int:
    return int(proc.url.rsplit(":", 1)[1])


def test_two_live_services_keep_their_own_logs_and_ledgers(
        two_gateways: tuple[Proc, Proc, Path], tmp_path: Path) -> None:
    a, b, root = two_gateways
    for proc, run in ((a, "run-a"), (b, "run-b")):
        r = httpx.post(proc.url + "/v1/chat/completions", timeout=30, headers={"x-grm-run": run},
                       json={"model": "rm", "messages": [{"role": "user", "content": run}]})
        assert r.status_code == 200, r.text
    folder_a, folder_b = (root / f"port-{_port(proc)}" for proc in (a, b))
    for proc, folder in ((a, folder_a), (b, folder_b)):
        assert f"work dir {folder}" in proc.tail(200)  # said at start-up, with the ledger
        assert f"ledger {folder / 'ledger.sqlite'}" in proc.tail(200)
    # A third service given the first one's folder on purpose is refused, naming its holder.
    third = subprocess.run(
        [sys.executable, "-m", "grm_service.cli", "serve", "--replica-url", "http://127.0.0.1:9",
         "--work-dir", str(folder_a), "--port", "0"], capture_output=True, text=True,
        timeout=60, check=False, env={**os.environ, "HOME": str(tmp_path), "COLUMNS": "300"})
    assert third.returncode == 2, third.stderr
    assert f"in use by a live service (pid {a.popen.pid}" in third.stderr
    a.stop()
    b.stop()
    for folder, run in ((folder_a, "run-a"), (folder_b, "run-b")):
        store = open_store(str(folder / "ledger.sqlite"), readonly=True)
        try:
            assert [r["run"] for r in store.runs()] == [run]
        finally:
            store.close()
