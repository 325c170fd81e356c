"""vLLM on CUDA GPUs, with batch-invariant kernels and the deterministic environment."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from grm_service import determinism
from grm_service.engine_side import vllm_plugin
from grm_service.engines.base import POOLING_UNMEASURED, Capabilities, Engine, ReplicaSpec
from grm_service.host import gpu_facts


def _sampling_invariant(version: str, env: Mapping[str, str]) -> bool:
    """True where top-p/top-k sampling takes one path at every batch size: vLLM does so itself,
    or grm-service's vLLM plugin makes it (a version it knows, or one the user forced)."""
    path = vllm_plugin.KNOWN_VERSIONS.get(version.split("+", 1)[0])
    mode = env.get(vllm_plugin.SWITCH_ENV, vllm_plugin.Mode.AUTO.value).strip().lower()
    if path is vllm_plugin.Sampling.TRITON_ALWAYS:
        return True
    if mode == vllm_plugin.Mode.OFF.value:
        return False
    return path is not None or mode == vllm_plugin.Mode.FORCE.value


# vLLM releases whose pooling outputs were measured bitwise identical under VLLM_BATCH_INVARIANT=1
# whether a request ran alone, co-batched, or shuffled among others (H200, 1.5B-shaped
# Qwen2ForSequenceClassification: benchmarks/gpu/RESULTS.md). Others keep pooling serialized.
POOLING_INVARIANT_VERSIONS = frozenset({"0.25.0"})


_POOLING_MEASURED = (
    "pooling measured bitwise alone vs co-batched under VLLM_BATCH_INVARIANT=1 on this vLLM "
    "release (H200, a sequence classifier on /classify); a replica co-batches pooling only once "
    "its pooling canary proved it for its own model's path (/classify, or /v1/embeddings with "
    "texts and images for CLIP/SigLIP): see pooling_batched")


def _pooling_invariant(version: str, env: Mapping[str, str]) -> bool:
    return (env.get("VLLM_BATCH_INVARIANT") == "1"
            and version.split("+", 1)[0] in POOLING_INVARIANT_VERSIONS)


class VllmGpu(Engine):
    name = "vllm"
    distribution = "vllm"

    def capabilities(
        self, version: str | None = None, env: Mapping[str, str] | None = None
    ) -> Capabilities:
        # Pooling reads the replica's env as reported (its identity), else what this profile
        # gives a replica: the deterministic contract, then the user's engine env on top.
        child = env if env is not None else {**self.deterministic_env(),
                                             **self.settings.engine_env}
        if env is None:
            env = {**os.environ, **self.settings.engine_env}
        version = version or self.version()
        sampling = _sampling_invariant(version, env)
        note = "VLLM_BATCH_INVARIANT=1: co-batched requests get the same bits"
        if not sampling:
            note += "; top_p/top_k sampling is not batch-invariant here, so it is serialized"
        pooling = _pooling_invariant(version, child)
        return Capabilities(batch_invariant=True, sampling_invariant=sampling, note=note,
                            pooling_invariant=pooling,
                            pooling_note=_POOLING_MEASURED if pooling else POOLING_UNMEASURED)

    def argv(self, spec: ReplicaSpec, host: str) -> list[str]:
        model = self.settings.model
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model,
                "--host", host, "--port", str(spec.port), *self.common_args()]

    def deterministic_env(self) -> dict[str, str]:
        return determinism.gpu_env(self.settings.seed)

    def replica_env(self, spec: ReplicaSpec) -> dict[str, str]:
        # The plugin acts only where REPLICA_ENV is set.
        env = {"TMPDIR": str(spec.tmp_dir), vllm_plugin.REPLICA_ENV: "1"}
        if spec.gpus:
            # `--gpus` ids are nvidia-smi's; CUDA counts fastest-first unless told PCI order.
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
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
