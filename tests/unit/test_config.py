from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from grm_service import determinism
from grm_service.commands.replica import replica_command
from grm_service.config import EngineName, Settings


def test_every_field_reads_its_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRM_MODEL", "/m")
    monkeypatch.setenv("GRM_REPLICAS", "3")
    monkeypatch.setenv("GRM_GPUS", "0, 1")
    monkeypatch.setenv("GRM_ENGINE", "vllm-cpu")
    monkeypatch.setenv("GRM_REPLICA_URLS", "http://a:1/,http://b:2")
    monkeypatch.setenv("GRM_ENGINE_ENV", '{"X": "1"}')
    s = Settings()
    assert (s.model, s.replicas, s.gpus, s.engine) == ("/m", 3, [0, 1], EngineName.VLLM_CPU)
    assert s.replica_urls == ["http://a:1", "http://b:2"]
    assert s.engine_env == {"X": "1"}


RENAMED_ENV = [("GRM_BACKEND_URLS", "GRM_REPLICA_URLS", "replica_urls", "http://a:1",
                ["http://a:1"], "http://b:2", ["http://b:2"]),
               ("GRM_BACKEND_ACK_TIMEOUT_S", "GRM_REPLICA_ACK_TIMEOUT_S", "replica_ack_timeout_s",
                "3", 3.0, "4", 4.0)]


@pytest.mark.parametrize(("old", "new", "field", "old_value", "old_read", "new_value",
                          "new_read"), RENAMED_ENV)
def test_a_renamed_env_var_is_still_read_and_warned_about_and_the_new_one_wins(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, old: str, new: str,
        field: str, old_value: str, old_read: object, new_value: str,
        new_read: object) -> None:
    monkeypatch.setenv(old, old_value)
    with caplog.at_level(logging.WARNING, "grm_service"):
        assert getattr(Settings(model="m"), field) == old_read
    assert [r.getMessage() for r in caplog.records] == [
        f"{old} is deprecated and will be removed in the next release: use {new}"]
    monkeypatch.setenv(new, new_value)
    assert getattr(Settings(model="m"), field) == new_read
    monkeypatch.delenv(old)
    caplog.clear()
    with caplog.at_level(logging.WARNING, "grm_service"):
        assert getattr(Settings(model="m"), field) == new_read
    assert caplog.records == []


def test_a_renamed_field_is_accepted_in_code_warned_and_read_under_both_names(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "grm_service"):
        old = Settings(backend_urls=["http://a:1"], backend_ack_timeout_s=3)  # type: ignore[call-arg]
    assert len(caplog.records) == 2 and "use 'replica_urls'" in caplog.records[0].getMessage()
    assert old == Settings(replica_urls=["http://a:1"], replica_ack_timeout_s=3)
    assert (old.backend_urls, old.backend_ack_timeout_s) == (["http://a:1"], 3.0)
    assert "backend_urls" not in old.model_dump()


def test_flags_win_over_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRM_SEED", "5")
    assert Settings(model="m", seed=9).seed == 9


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "--model is required"),
        ({"model": "m", "replicas": 0}, "greater than or equal to 1"),
        ({"replica_urls": ["ftp://x"]}, "replica url 'ftp://x' must start with http"),
        ({"model": "m", "serialize": "sometimes"}, "'auto', 'on' or 'off'"),
        ({"model": "m", "workers": 0}, "greater than or equal to 1"),
    ],
)
def test_invalid_settings_say_what_to_fix(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(**kwargs)  # type: ignore[arg-type]


def test_settings_are_frozen() -> None:
    s = Settings(model="m")
    with pytest.raises(ValidationError):
        s.seed = 1  # type: ignore[misc]


def test_settings_reach_a_worker_process_unchanged() -> None:
    """`serve --workers N` hands each worker the settings as JSON (workers.py)."""
    given = Settings(model="m", workers=3, gpus=[0, 1], engine_env={"X": "1"},
                     api_keys=["k"], max_model_len=2048, engine_args=["--enforce-eager"])
    assert Settings.model_validate_json(given.model_dump_json()) == given


def test_settings_limits_must_agree() -> None:
    with pytest.raises(ValidationError, match="cannot carry one image"):
        Settings(model="m", max_body_bytes=1 << 20)
    with pytest.raises(ValidationError, match="GRM_MAX_TOKENS_LIMIT"):
        Settings(model="m", max_tokens_default=9000, max_tokens_limit=8192)
    Settings(model="m", max_body_bytes=1 << 20, max_image_bytes=512 << 10)


# The VLM recipe's engine args as argv tokens (tests/support/engines.py): a JSON value with a
# comma and a space, and a flag with its value as two tokens.
ENGINE_WORDS = ["--enforce-eager", "--max-model-len", "8192",
                "--limit-mm-per-prompt", '{"image": 8, "video": 0}']


@pytest.mark.parametrize("value", [
    """--enforce-eager --max-model-len 8192 --limit-mm-per-prompt '{"image": 8, "video": 0}'""",
    json.dumps(ENGINE_WORDS),
    "  " + json.dumps(ENGINE_WORDS, indent=1) + "\n",
])
def test_engine_args_env_is_shell_words_or_a_json_list(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path, value: str) -> None:
    monkeypatch.setenv("GRM_ENGINE_ARGS", value)
    settings = Settings(model="/models/rm", engine="vllm-cpu", work_dir=tmp_path)
    assert settings.engine_args == ENGINE_WORDS
    command = replica_command(settings, {})
    shutil.rmtree(command.env["TMPDIR"])  # the recipe made the replica's temp dir
    argv = command.argv
    start = argv.index("--enforce-eager")
    assert argv[start : start + len(ENGINE_WORDS)] == ENGINE_WORDS


@pytest.mark.parametrize(("value", "message"), [
    ("--enforce-eager,--limit-mm-per-prompt.image=8", "joins flags with commas"),
    ("--limit-mm-per-prompt '{\"image\": 8", "not shell words"),
    ('["--enforce-eager", 8]', "strings only"),
    ('["--enforce-eager",', "not a JSON list"),
    ("--enforce-eager --api-key s3cret", "GRM_REPLICA_API_KEY"),
    ("--api-key=s3cret", "GRM_REPLICA_API_KEY"),
])
def test_engine_args_env_refuses_what_the_engine_would_misread(
        monkeypatch: pytest.MonkeyPatch, value: str, message: str) -> None:
    monkeypatch.setenv("GRM_ENGINE_ARGS", value)
    with pytest.raises(ValidationError, match=message):
        Settings(model="/models/rm")


def test_the_replicas_key_reaches_launched_replicas_and_not_their_identity(
        tmp_path: Path) -> None:
    """vLLM reads VLLM_API_KEY where --api-key is not given; the key is no numerics input."""
    plain = replica_command(Settings(model="/models/rm", engine="vllm-cpu", work_dir=tmp_path),
                            {})
    keyed = replica_command(Settings(model="/models/rm", engine="vllm-cpu", work_dir=tmp_path,
                                     replica_api_key="s3cret"), {})
    for folder in {plain.env["TMPDIR"], keyed.env["TMPDIR"]}:  # the recipes made them
        shutil.rmtree(folder)
    assert keyed.env["VLLM_API_KEY"] == "s3cret" and "VLLM_API_KEY" not in plain.env
    assert "s3cret" not in " ".join(keyed.argv)  # argv is visible to every user of the host
    assert determinism.numerics_env(keyed.env) == determinism.numerics_env(plain.env)


@pytest.mark.parametrize("key", ["two words", "line\r\nX-Injected: 1", "caf\u00e9"])
def test_the_replicas_key_must_be_one_printable_ascii_word(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValidationError, match="replica_api_key"):
        Settings(model="/models/rm", replica_api_key=key)


def test_engine_args_env_reaches_the_replicas_identity(tmp_path: Path) -> None:
    """`grm-service fingerprint` reads the replica's argv as the replica will: with the value as
    its own token, the context length is an env-digest input."""
    model = tmp_path / "rm"
    model.mkdir()
    (model / "config.json").write_text("{}")
    env = {**os.environ, "GRM_ENGINE_ARGS": "--max-model-len 8192 --enforce-eager",
           "GRM_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-m", "grm_service.cli", "fingerprint", "--model",
                             str(model), "--engine", "vllm-cpu"], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    numerics = json.loads(result.stdout)["env_inputs"]["numerics"]
    assert numerics["max_model_len"] == 8192 and numerics["enforce_eager"] is True
