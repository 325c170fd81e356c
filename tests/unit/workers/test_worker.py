"""One gateway worker process (and the keeper's process it follows), launched as
`workers.Manager` launches them: a listening socket handed over by fd, the settings as JSON on
stdin, this process as their parent."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grm_service.config import Settings
from grm_service.workers.manager import FATAL_EXIT
from tests.support.procs import Proc


def launch(settings: Settings, run_dir: Path, sock: socket.socket | None, parent: int,
           log: Path) -> subprocess.Popen[bytes]:
    """Worker 0 on `sock`; without one, the keeper's process."""
    run_dir.mkdir(exist_ok=True)  # the manager's, shared by its workers
    common = ["--run-dir", str(run_dir), "--parent", str(parent), "--log-level", "info"]
    argv = [sys.executable, "-m", "grm_service.workers.keeper_process", *common]
    if sock is not None:
        argv = [sys.executable, "-m", "grm_service.workers.worker", "--index", "0",
                "--listen-fd", str(sock.fileno()), *common]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                pass_fds=(sock.fileno(),) if sock else (),
                                start_new_session=True)
    assert proc.stdin is not None
    proc.stdin.write(settings.model_dump_json().encode())
    proc.stdin.close()
    return proc


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock


def ended(proc: subprocess.Popen[bytes], timeout_s: float = 30) -> int:
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        raise


def test_a_worker_serves_on_the_socket_it_was_given(
    stub: Proc, tmp_path: Path, listening: socket.socket
) -> None:
    settings = Settings(replica_urls=[stub.url], served_model_name="rm", work_dir=tmp_path)
    log, keeper_log = tmp_path / "worker.log", tmp_path / "keeper.log"
    keeper = launch(settings, tmp_path / "run", None, os.getpid(), keeper_log)
    proc = launch(settings, tmp_path / "run", listening, os.getpid(), log)
    url = f"http://127.0.0.1:{listening.getsockname()[1]}"
    try:
        deadline, ready = time.monotonic() + 30, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = httpx.get(url + "/ready", timeout=5)
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert ready is not None and ready.status_code == 200, log.read_text()
        assert [r["url"] for r in ready.json()["replicas"]] == [stub.url]
        assert (tmp_path / "run" / "replicas.json").exists(), "the keeper publishes"
    finally:
        for each in (proc, keeper):
            if each.poll() is None:
                os.killpg(each.pid, signal.SIGTERM)
    assert ended(proc) == 0 and ended(keeper) == 0
    assert "worker 0 of 1 serving" in log.read_text()
    assert "stopping the replicas" in keeper_log.read_text()


def test_a_worker_whose_parent_is_already_gone_exits(tmp_path: Path,
                                                      listening: socket.socket) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    settings = Settings(replica_urls=["http://127.0.0.1:9"], work_dir=tmp_path)
    proc = launch(settings, tmp_path / "run", listening, gone.pid, tmp_path / "w.log")
    assert ended(proc) == 1
    assert (tmp_path / "w.log").read_text() == "", "it ended before serving anything"


def test_a_worker_that_cannot_start_says_so_in_its_exit_code(
    tmp_path: Path, listening: socket.socket
) -> None:
    nobody = "http://127.0.0.1:9"
    settings = Settings(replica_urls=[nobody], work_dir=tmp_path,
                        scorers=["x=tests.support.scoring:missing"])
    log = tmp_path / "worker.log"
    proc = launch(settings, tmp_path / "run", listening, os.getpid(), log)
    assert ended(proc) == FATAL_EXIT, log.read_text()
    assert "cannot load" in log.read_text()
