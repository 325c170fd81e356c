"""The workers' manager: the run dirs of managers that are gone are swept at start; a taken
port ends `serve --workers N` at once."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
from pathlib import Path

import pytest

from grm_service.config import Settings
from grm_service.workers.manager import FATAL_EXIT, run_workers, sweep_stale_run_dirs
from tests.support.procs import gone_pid


def test_run_dirs_of_gone_managers_are_swept_the_others_kept(tmp_path: Path) -> None:
    gone = tmp_path / f"grm-workers-{gone_pid()}-abc123"
    mine = tmp_path / f"grm-workers-{os.getpid()}-def456"
    unnamed = tmp_path / "grm-workers-x1y2z3"  # an older release's: no pid to tell by
    others = tmp_path / f"grm-other-{gone_pid()}-abc"
    for folder in (gone, mine, unnamed, others):
        (folder / "metrics").mkdir(parents=True)
    assert sweep_stale_run_dirs(tmp_path) == [gone]
    assert not gone.exists() and mine.is_dir() and unnamed.is_dir() and others.is_dir()


def test_a_taken_port_ends_serve_with_the_fatal_code_and_starts_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where a run dir would go
    monkeypatch.setattr(tempfile, "tempdir", None)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(8)
        port = other.getsockname()[1]
        settings = Settings(replica_urls=["http://127.0.0.1:9"], host="127.0.0.1", port=port,
                            workers=2)
        with caplog.at_level(logging.ERROR):
            assert run_workers(settings, "info") == FATAL_EXIT
    assert f"cannot listen on 127.0.0.1:{port}" in caplog.text
    assert list(tmp_path.iterdir()) == []  # no run dir made
