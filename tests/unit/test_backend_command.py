"""`grm-service backend`: one replica with exactly the engine profile's argv and env."""

from __future__ import annotations

from pathlib import Path

from grm_service.commands.backend import backend_command
from grm_service.config import Settings
from grm_service.engines import select_engine


def test_backend_uses_the_profile_argv_env_and_binds_its_host(tmp_path: Path) -> None:
    settings = Settings(model="/models/rm", engine="vllm-cpu", seed=7, host="0.0.0.0", port=9100,
                        served_model_name="rm", work_dir=tmp_path, engine_args=["--enforce-eager"],
                        engine_env={"EXTRA": "1"})
    argv, env = backend_command(settings, {"PATH": "/bin", "PYTHONHASHSEED": "0"})
    assert argv[-2:] == ["--host", "0.0.0.0"]  # the engine's argparse keeps the last --host
    assert argv[argv.index("--port") + 1] == "9100"
    assert argv[argv.index("--seed") + 1] == "7"
    assert "--enforce-eager" in argv
    engine = select_engine(settings)
    for key, value in engine.deterministic_env().items():
        assert env[key] == value
    assert env["PYTHONHASHSEED"] == "7" and env["EXTRA"] == "1" and env["PATH"] == "/bin"
    assert (tmp_path / "r0" / "tmp").is_dir()
