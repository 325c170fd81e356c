"""torch's default cache folder linked to the replicas' shared inductor cache: the link, what
stays as it was, and the installed torch's own layout (where it keeps the precompiled header)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from grm_service.engine_side import header_cache
from grm_service.engine_side.header_cache import INDUCTOR_CACHE_ENV
from tests.support.engines import unmeasured_environ


def _default(path: Path) -> Callable[[], str]:
    return lambda: str(path)


def test_the_default_folder_becomes_a_link_to_the_shared_cache(tmp_path: Path) -> None:
    shared, default = tmp_path / "cache" / "torchinductor", tmp_path / "tmp" / "torchinductor_u"
    shared.mkdir(parents=True)
    env = {INDUCTOR_CACHE_ENV: str(shared)}
    said = header_cache.share(env, _default(default))
    assert default.is_symlink() and default.resolve() == shared.resolve(), said
    (default / "precompiled_headers").mkdir()
    assert (shared / "precompiled_headers").is_dir()
    # The replica's other processes find it made.
    assert "is the shared one" in header_cache.share(env, _default(default))


def test_a_link_made_by_another_process_in_between_is_taken(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    shared, default = tmp_path / "shared", tmp_path / "torchinductor_u"
    shared.mkdir()
    real_resolve = Path.resolve
    calls = []

    def first_resolve_then_race(self: Path, strict: bool = False) -> Path:
        calls.append(self)
        if self == default and len(calls) == 1:
            default.symlink_to(shared, target_is_directory=True)  # the other process wins
            return self
        return real_resolve(self, strict)

    monkeypatch.setattr(Path, "resolve", first_resolve_then_race)
    said = header_cache.share({INDUCTOR_CACHE_ENV: str(shared)}, _default(default))
    assert said == f"header cache: {default} -> {shared}"


def test_a_real_folder_in_its_place_is_left_and_said(tmp_path: Path) -> None:
    shared, default = tmp_path / "shared", tmp_path / "torchinductor_u"
    shared.mkdir()
    (default / "fxgraph").mkdir(parents=True)
    said = header_cache.share({INDUCTOR_CACHE_ENV: str(shared)}, _default(default))
    assert "built per start" in said and not default.is_symlink()
    assert (default / "fxgraph").is_dir()


def test_a_folder_that_cannot_be_made_leaves_vllm_running(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    default = tmp_path / "file" / "torchinductor_u"
    said = header_cache.share({INDUCTOR_CACHE_ENV: str(tmp_path / "shared")}, _default(default))
    assert said.startswith(f"header cache: cannot link {default}") and "built per start" in said


def test_without_a_shared_cache_or_torch_nothing_is_made(tmp_path: Path) -> None:
    default = tmp_path / "torchinductor_u"
    assert "no shared inductor cache" in header_cache.share({}, _default(default))

    def no_torch() -> str:
        raise ImportError("No module named 'torch'")

    said = header_cache.share({INDUCTOR_CACHE_ENV: str(tmp_path)}, no_torch)
    assert "unknown" in said and "built per start" in said
    assert not default.exists()


_REAL_LAYOUT = """
import os
from grm_service.engine_side import header_cache
from torch._inductor import codecache
default = header_cache.torch_default_cache_dir()
print(default.startswith(os.environ["TMPDIR"]))
print(os.path.dirname(codecache._HEADER_DIR) == default)
"""


def test_the_installed_torch_keeps_its_header_in_the_default_folder(tmp_path: Path) -> None:
    # A fresh process (torch's inductor import is heavy, and reads TMPDIR once), unmeasured:
    # what it runs of header_cache is measured above.
    env = {**unmeasured_environ(), "TMPDIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", _REAL_LAYOUT], env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["True", "True"]
