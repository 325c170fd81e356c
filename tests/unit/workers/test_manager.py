"""The workers' manager: the run dirs of managers that are gone are swept at start."""

from __future__ import annotations

import os
from pathlib import Path

from grm_service.workers.manager import sweep_stale_run_dirs
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
