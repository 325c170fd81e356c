"""What an engine profile is: how to start one replica and what it can guarantee."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from grm_service.config import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Capabilities:
    """`batch_invariant`: requests may share a batch and still get the same bits.
    `sampling_invariant`: that also holds for top_p < 1 / top_k sampling."""

    batch_invariant: bool
    sampling_invariant: bool
    note: str


@dataclass(frozen=True)
class ReplicaSpec:
    name: str
    index: int
    port: int
    work_dir: Path
    gpus: tuple[int, ...] = ()

    @property
    def tmp_dir(self) -> Path:
        """A short temp dir: vLLM puts ZeroMQ IPC sockets there, and a Unix socket path must fit
        in 107 bytes, which a deep work dir would overflow. The launching process's pid keeps two
        services that share a work dir from deleting each other's sockets."""
        tag = hashlib.blake2b(str(self.work_dir).encode(), digest_size=5).hexdigest()
        return Path(tempfile.gettempdir()) / f"grm-{tag}-{os.getpid()}-{self.name}"


_VERSION_LINE = re.compile(r"^__version__\s*(?::\s*\S+)?\s*=\s*(?:version\s*=\s*)?'([^']+)'", re.M)


def distribution_version(name: str, module: str | None = None) -> str:
    """The installed version; for a package unpacked without metadata, its `_version.py`."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec(module) if module else None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            match = _VERSION_LINE.search((Path(folder) / "_version.py").read_text())
        except OSError:
            continue
        if match:
            return match.group(1)
    return "not-installed"


def _torch_cuda_version() -> str:
    """torch/version.py holds plain assignments; reading it avoids importing torch (seconds)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "none"
    version_py = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        match = re.search(r"^cuda\s*(?::\s*\S+)?\s*=\s*'([^']*)'", version_py.read_text(), re.M)
    except OSError:
        return "unknown"
    return match.group(1) if match else "none"


@cache
def gpu_facts() -> tuple[tuple[str, str], ...]:
    """(name, driver) of each visible NVIDIA GPU; empty without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return ()
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    rows = [tuple(part.strip() for part in line.split(",", 1)) for line in out.splitlines()]
    return tuple((r[0], r[1]) for r in rows if len(r) == 2)


@cache
def cpu_model() -> str:
    """CPU model and the vector extensions that pick CPU kernels (AVX2 vs AVX-512 differ)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    name = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    isa = sorted(f for f in (flags.group(1).split() if flags else []) if f.startswith("avx"))
    return f"{name.group(1).strip() if name else platform.machine()} [{' '.join(isa)}]"


def arg_value(args: list[str], *names: str) -> str | None:
    """The value of the last `--name v` or `--name=v` among engine args."""
    found = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


class Engine(ABC):
    name: ClassVar[str]
    distribution: ClassVar[str]

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def version(self) -> str:
        return distribution_version(self.distribution, "vllm")

    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    @abstractmethod
    def argv(self, spec: ReplicaSpec) -> list[str]: ...

    @abstractmethod
    def deterministic_env(self) -> dict[str, str]:
        """The environment every replica shares; each key is an env-digest input."""

    @abstractmethod
    def replica_env(self, spec: ReplicaSpec) -> dict[str, str]:
        """Per-replica placement (cores, GPUs, temp dirs): not numerics, not in the digest."""

    def gpu_set(self, index: int) -> tuple[int, ...]:
        return ()

    def device(self) -> str:
        return cpu_model()

    def common_args(self) -> list[str]:
        s = self.settings
        args = ["--seed", str(s.seed), "--served-model-name", s.model_name, "--dtype", s.dtype]
        if s.max_model_len:
            args += ["--max-model-len", str(s.max_model_len)]
        return args + list(s.engine_args)

    def tensor_parallel_size(self) -> int:
        value = arg_value(self.settings.engine_args, "--tensor-parallel-size", "-tp")
        return int(value) if value and value.isdigit() else 1

    def numerics(self) -> dict[str, Any]:
        args = self.settings.engine_args
        return {
            "dtype": arg_value(args, "--dtype") or self.settings.dtype,
            "max_model_len": arg_value(args, "--max-model-len") or self.settings.max_model_len,
            "quantization": arg_value(args, "--quantization", "-q"),
            "kv_cache_dtype": arg_value(args, "--kv-cache-dtype"),
            "tensor_parallel_size": self.tensor_parallel_size(),
            "enforce_eager": "--enforce-eager" in args,
        }

    def env_inputs(self) -> dict[str, Any]:
        """Every input of the env digest, in clear, so a user can see why two digests differ."""
        return {
            "engine": self.name,
            "engine_version": self.version(),
            "torch_version": distribution_version("torch"),
            "torch_cuda": _torch_cuda_version(),
            "device": self.device(),
            "env": {**self.deterministic_env(), **self.settings.engine_env},
            "numerics": self.numerics(),
        }
