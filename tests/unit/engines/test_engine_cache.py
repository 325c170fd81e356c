"""vLLM's cache: one per cache dir, shared by the replicas of a service and its later starts."""

from __future__ import annotations

from pathlib import Path

from grm_service.config import Settings
from grm_service.engines.base import ReplicaSpec
from grm_service.engines.vllm_cpu import VllmCpu
from grm_service.engines.vllm_gpu import VllmGpu


def test_the_replicas_of_a_service_share_one_vllm_cache(tmp_path: Path) -> None:
    settings = Settings(model="m", cache_dir=tmp_path / "cache", work_dir=tmp_path / "run")
    shared = tmp_path / "cache" / "vllm"
    for engine in (VllmCpu(settings), VllmGpu(settings)):
        commands = [engine.command(ReplicaSpec(name=f"r{i}", index=i, port=9000 + i,
                                               work_dir=settings.work_dir / f"r{i}"), {})
                    for i in range(2)]
        assert {c.env["VLLM_CACHE_ROOT"] for c in commands} == {str(shared)}
        assert all(shared in c.dirs for c in commands)  # made before the replica starts
        # Each replica keeps a temp folder of its own (vLLM's IPC sockets live there).
        assert len({c.env["TMPDIR"] for c in commands}) == 2
