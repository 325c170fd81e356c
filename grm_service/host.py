"""Facts about the host a process runs on: installed versions, GPUs, CPU model, live processes
(and the removal of folders whose owning process is gone).

Read without importing the heavy packages they describe (torch, vLLM take seconds to import).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

from grm_service.digits import decimal

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


def torch_cuda_version() -> str:
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
def gpu_listing() -> str:
    """`nvidia-smi -L`: each GPU's index, model and UUID, and its MIG instances; empty without
    nvidia-smi (parsed by `grm_service.gpus`)."""
    if not shutil.which("nvidia-smi"):
        return ""
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


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


def process_running(pid: int) -> bool:
    """Whether a process of this pid runs (this one, or another user's, counts)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_owners(folder: Path, prefix: str, suffix: str = "*") -> list[Path]:
    """Remove the folders `<prefix><pid>-<suffix>` in `folder` whose owner, the process of that
    pid, is gone (SIGKILLed, or become another program by exec); those of live ones stay."""
    removed = []
    for path in folder.glob(f"{prefix}*-{suffix}"):
        pid = decimal(path.name[len(prefix):].split("-", 1)[0])
        if pid is not None and not process_running(pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
