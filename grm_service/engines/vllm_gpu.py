"""vLLM on CUDA GPUs, with batch-invariant kernels and the deterministic environment."""

from __future__ import annotations

import sys

from grm_service import determinism
from grm_service.engines.base import Capabilities, Engine, ReplicaSpec, gpu_facts


def _sampler_patch_supported(version: str) -> bool:
    """True where grm-service's vLLM plugin makes top-p/top-k sampling batch-invariant."""
    try:
        from grm_service import vllm_plugin
    except ImportError:
        return False
    return bool(vllm_plugin.supports(version))


class VllmGpu(Engine):
    name = "vllm"
    distribution = "vllm"

    def capabilities(self) -> Capabilities:
        sampling = _sampler_patch_supported(self.version())
        note = "VLLM_BATCH_INVARIANT=1: co-batched requests get the same bits"
        if not sampling:
            note += "; top_p/top_k sampling is not batch-invariant here, so it is serialized"
        return Capabilities(batch_invariant=True, sampling_invariant=sampling, note=note)

    def argv(self, spec: ReplicaSpec) -> list[str]:
        model = self.settings.model
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model,
                "--host", "127.0.0.1", "--port", str(spec.port), *self.common_args()]

    def deterministic_env(self) -> dict[str, str]:
        return determinism.gpu_env(self.settings.seed)

    def replica_env(self, spec: ReplicaSpec) -> dict[str, str]:
        env = {"VLLM_CACHE_ROOT": str(spec.work_dir / "vllm-cache")}
        if spec.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.gpus))
        return env

    def gpu_set(self, index: int) -> tuple[int, ...]:
        """Replica i takes the next tensor-parallel-size GPUs, wrapping so replicas can share."""
        gpus = list(self.settings.gpus) or list(range(len(gpu_facts())))
        if not gpus:
            return ()
        tp = self.tensor_parallel_size()
        start = (index * tp) % len(gpus)
        return tuple(gpus[(start + k) % len(gpus)] for k in range(tp))

    def device(self) -> str:
        facts = gpu_facts()
        names = sorted({f"{name} (driver {driver})" for name, driver in facts})
        return ", ".join(names) or "no-gpu-visible"
