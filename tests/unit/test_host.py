"""Host facts read without importing what they describe: versions from metadata or a bare
`_version.py`, torch's CUDA build from its `version.py`, and the GPUs from `nvidia-smi`'s output
(a script standing in for the tool: this machine has no GPU)."""

from __future__ import annotations

import importlib.metadata
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from grm_service import host


def package(root: Path, name: str, files: dict[str, str]) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    for file, text in files.items():
        (root / name / file).write_text(text)


def test_an_installed_distribution_reports_its_metadata_version() -> None:
    assert host.distribution_version("pytest") == importlib.metadata.version("pytest")


def test_a_package_unpacked_without_metadata_reports_its_version_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package(tmp_path, "grm_unpacked", {"_version.py": "__version__ = version = '0.25.1'\n"})
    package(tmp_path, "grm_bare", {})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert host.distribution_version("grm-unpacked-dist", "grm_unpacked") == "0.25.1"
    assert host.distribution_version("grm-bare-dist", "grm_bare") == "not-installed"
    assert host.distribution_version("grm-nothing-dist") == "not-installed"


@pytest.mark.parametrize(("version_py", "expected"), [
    ("cuda: Optional[str] = '12.8'\n", "12.8"),
    ("cuda = None\n", "none"),
    (None, "unknown"),
])
def test_torch_cuda_build_is_read_from_its_version_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version_py: str | None,
        expected: str) -> None:
    package(tmp_path, "torch", {} if version_py is None else {"version.py": version_py})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # find_spec would answer from it
    assert host.torch_cuda_version() == expected


@pytest.fixture
def nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    host.gpu_facts.cache_clear()
    host.gpu_listing.cache_clear()
    yield tool
    host.gpu_facts.cache_clear()
    host.gpu_listing.cache_clear()


def script(tool: Path, body: str) -> None:
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


def test_gpus_are_read_from_nvidia_smi(nvidia_smi: Path) -> None:
    script(nvidia_smi, """case "$1" in
  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-1)"; echo "GPU 1: NVIDIA H200 (UUID: GPU-2)";;
  *) printf 'NVIDIA H200, 580.95\\nNVIDIA H200, 580.95\\n';;
esac""")
    assert host.gpu_facts() == (("NVIDIA H200", "580.95"), ("NVIDIA H200", "580.95"))
    assert host.gpu_listing().splitlines()[1] == "GPU 1: NVIDIA H200 (UUID: GPU-2)"


def test_a_failing_nvidia_smi_means_no_gpus(nvidia_smi: Path) -> None:
    script(nvidia_smi, "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    assert host.gpu_facts() == ()
    assert host.gpu_listing() == ""


def test_the_cpu_model_names_its_vector_extensions() -> None:
    model = host.cpu_model()
    assert model.endswith("]") and "[" in model
