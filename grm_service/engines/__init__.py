"""Engine profiles: how to launch and talk to each engine."""

from __future__ import annotations

from grm_service.config import EngineName, Settings
from grm_service.engines.base import Capabilities, ChildCommand, Engine, ReplicaSpec
from grm_service.engines.vllm_cpu import VllmCpu
from grm_service.engines.vllm_gpu import VllmGpu
from grm_service.host import gpu_facts

__all__ = [
    "Capabilities",
    "ChildCommand",
    "Engine",
    "ReplicaSpec",
    "VllmCpu",
    "VllmGpu",
    "engine_named",
    "resolve_engine",
    "select_engine",
]


def resolve_engine(requested: EngineName) -> EngineName:
    """`auto` means the GPU build where a CUDA GPU is visible, else the CPU build."""
    if requested is not EngineName.AUTO:
        return requested
    return EngineName.VLLM if gpu_facts() else EngineName.VLLM_CPU


def select_engine(settings: Settings) -> Engine:
    name = resolve_engine(settings.engine)
    return VllmGpu(settings) if name is EngineName.VLLM else VllmCpu(settings)


def engine_named(name: str, settings: Settings) -> Engine:
    """The profile of the engine a replica reported running (not the gateway host's guess)."""
    return VllmCpu(settings) if name == VllmCpu.name else VllmGpu(settings)
