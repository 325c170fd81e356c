"""`grm-service replica`: one replica with exactly the engine profile's recipe."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from grm_service.commands.replica import replica_command, replica_spec
from grm_service.config import Settings
from grm_service.engine_side.identity import MIDDLEWARE
from grm_service.engines import select_engine
from tests.support.procs import gone_pid


@pytest.fixture(autouse=True)
def _no_temp_dir_left(tmp_path: Path) -> Iterator[None]:
    """Each test's recipe makes its replica's temp dir (in the system's temp folder)."""
    yield
    settings = Settings(model="/models/rm", engine="vllm-cpu", work_dir=tmp_path)
    shutil.rmtree(replica_spec(settings, select_engine(settings)).tmp_dir, ignore_errors=True)


def test_a_replica_uses_the_profile_recipe_and_binds_its_host(tmp_path: Path) -> None:
    settings = Settings(model="/models/rm", engine="vllm-cpu", seed=7, host="0.0.0.0", port=9100,
                        served_model_name="rm", work_dir=tmp_path, cache_dir=tmp_path / "cache",
                        engine_args=["--enforce-eager"],
                        engine_env={"EXTRA": "1"})
    command = replica_command(settings, {"PATH": "/bin", "PYTHONHASHSEED": "0"})
    argv, env = command.argv, command.env
    assert argv.count("--host") == 1 and argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--port") + 1] == "9100"
    assert argv[argv.index("--seed") + 1] == "7"
    assert argv[argv.index("--middleware") + 1] == MIDDLEWARE  # the replica serves its identity
    assert "--enforce-eager" in argv
    engine = select_engine(settings)
    for key, value in engine.deterministic_env().items():
        assert env[key] == value
    assert env["PYTHONHASHSEED"] == "7" and env["EXTRA"] == "1" and env["PATH"] == "/bin"
    # Every folder the recipe points the engine at exists (TMPDIR included).
    assert Path(env["TMPDIR"]).is_dir() and Path(env["VLLM_CACHE_ROOT"]).is_dir()
    assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).is_dir()
    assert all(folder.is_dir() for folder in command.dirs)


def test_a_replica_sweeps_the_temp_dir_an_earlier_replica_left(tmp_path: Path) -> None:
    """A replica becomes the engine (exec): nothing of it is left to remove its temp dir, so
    the next replica on the same work dir does, once that process is gone."""
    settings = Settings(model="/models/rm", engine="vllm-cpu", work_dir=tmp_path)
    mine = replica_spec(settings, select_engine(settings)).tmp_dir
    left = mine.with_name(f"{mine.name.rsplit('-', 2)[0]}-{gone_pid()}-r0")
    (left / "sockets").mkdir(parents=True)
    command = replica_command(settings, {})
    assert not left.exists()
    assert Path(command.env["TMPDIR"]) == mine and mine.is_dir()


def test_a_gateway_workers_metrics_folder_does_not_reach_the_engine(tmp_path: Path) -> None:
    """`serve --workers N` gives its workers PROMETHEUS_MULTIPROC_DIR; the replicas they start
    must not write their metrics into the gateway's /metrics."""
    settings = Settings(model="/models/rm", engine="vllm-cpu", work_dir=tmp_path)
    command = replica_command(settings, {"PATH": "/bin", "PROMETHEUS_MULTIPROC_DIR": "/run/x"})
    assert "PROMETHEUS_MULTIPROC_DIR" not in command.env and command.env["PATH"] == "/bin"


def test_an_operator_chosen_core_binding_wins_over_the_default_spread(tmp_path: Path) -> None:
    """Each `replica` is replica 0 of one: without a binding of its own, every one would take
    core 0."""
    default = replica_command(Settings(model="/models/rm", engine="vllm-cpu", work_dir=tmp_path),
                              {})
    assert default.env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    chosen = Settings(model="/models/rm", engine="vllm-cpu", work_dir=tmp_path,
                      engine_env={"VLLM_CPU_OMP_THREADS_BIND": "1"})
    assert replica_command(chosen, {}).env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
