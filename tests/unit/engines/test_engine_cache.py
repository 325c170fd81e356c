"""The engines' caches (vLLM's, torch inductor's): one per cache dir, shared by the replicas of a
service and its later starts; a replica's temp dir is its own, and swept once its launcher is
gone."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from grm_service.config import Settings
from grm_service.engines.base import ChildCommand, Engine, ReplicaSpec
from grm_service.engines.vllm_cpu import VllmCpu
from grm_service.engines.vllm_gpu import VllmGpu
from tests.support.procs import gone_pid


def _two_replicas(engine: Engine) -> list[ChildCommand]:
    return [engine.command(ReplicaSpec(name=f"r{i}", index=i, port=9000 + i,
                                       work_dir=engine.settings.work_dir / f"r{i}"), {})
            for i in range(2)]


def test_the_replicas_of_a_service_share_one_vllm_cache(tmp_path: Path) -> None:
    settings = Settings(model="m", cache_dir=tmp_path / "cache", work_dir=tmp_path / "run")
    shared = tmp_path / "cache" / "vllm"
    for engine in (VllmCpu(settings), VllmGpu(settings)):
        commands = _two_replicas(engine)
        assert {c.env["VLLM_CACHE_ROOT"] for c in commands} == {str(shared)}
        assert all(shared in c.dirs for c in commands)  # made before the replica starts
        # Each replica keeps a temp folder of its own (vLLM's IPC sockets live there).
        assert len({c.env["TMPDIR"] for c in commands}) == 2


def test_the_replicas_share_one_inductor_cache_unless_the_operator_sets_one(tmp_path: Path
                                                                            ) -> None:
    """The sampler's compiled kernels and their 150 MB precompiled header are made once per
    cache dir, not once per replica start in its temp dir."""
    settings = Settings(model="m", cache_dir=tmp_path / "cache", work_dir=tmp_path / "run")
    shared = tmp_path / "cache" / "torchinductor"
    for engine in (VllmCpu(settings), VllmGpu(settings)):
        commands = _two_replicas(engine)
        assert {c.env["TORCHINDUCTOR_CACHE_DIR"] for c in commands} == {str(shared)}
        assert all(shared in c.dirs for c in commands)
        assert all(not c.env["TORCHINDUCTOR_CACHE_DIR"].startswith(c.env["TMPDIR"])
                   for c in commands)
    own = settings.model_copy(update={"engine_env": {"TORCHINDUCTOR_CACHE_DIR": "/srv/ind"}})
    spec = ReplicaSpec(name="r0", index=0, port=9000, work_dir=tmp_path / "run" / "r0")
    assert VllmCpu(own).command(spec, {}).env["TORCHINDUCTOR_CACHE_DIR"] == "/srv/ind"


def test_temp_dirs_of_gone_launchers_are_swept_those_of_live_ones_kept(tmp_path: Path) -> None:
    spec = ReplicaSpec(name="r0", index=0, port=9000, work_dir=tmp_path / "run" / "r0")
    other = ReplicaSpec(name="r1", index=1, port=9001, work_dir=tmp_path / "run" / "r1")
    mine = spec.tmp_dir
    prefix = mine.name.rsplit("-", 2)[0]  # grm-<work dir's tag>, then -<pid>-<name>
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        gone = mine.with_name(f"{prefix}-{gone_pid()}-r0")
        alive = mine.with_name(f"{prefix}-{live.pid}-r0")
        for folder in (mine, gone, alive, other.tmp_dir):
            (folder / "sockets").mkdir(parents=True)
        try:
            assert spec.sweep_stale_tmp() == [gone]
            assert not gone.exists()
            assert mine.is_dir() and alive.is_dir() and other.tmp_dir.is_dir()
        finally:
            for folder in (mine, gone, alive, other.tmp_dir):
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        live.kill()
        live.wait()
