"""The command line: every option of the commands that build Settings is an env var, shown in
--help, and read as the settings model reads it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grm_service import cli
from grm_service.config import Settings
from tests.support.cli import command, options, settings_for

SETTINGS_COMMANDS = ("serve", "replica", "fingerprint")


def env_var(option: str) -> str:
    """The variable the settings model reads for the option's field (GRM_<FIELD>)."""
    field = cli.FIELD_OF.get(option, option)
    assert field in Settings.model_fields or field in cli.CLI_ONLY, option
    return cli.CLI_ONLY.get(field) or f"GRM_{field.upper()}"


@pytest.mark.parametrize("name", SETTINGS_COMMANDS)
def test_every_option_has_the_env_var_of_its_setting(name: str) -> None:
    """A new option without an env var, or with one the settings model does not read, fails."""
    found = [option for option in options(name) if option.name not in cli.RENAMED_OPTIONS]
    assert found
    for option in found:
        assert option.name is not None
        assert option.envvar == env_var(option.name), option.name
        assert option.show_envvar, option.name


def test_serve_help_names_the_env_var_of_every_option() -> None:
    """typer's rich help once swallowed `[env GRM_MODEL]` written into a help text as markup:
    what a user reads is the check."""
    shown = subprocess.run(
        [sys.executable, "-m", "grm_service.cli", "serve", "--help"], capture_output=True,
        text=True, timeout=120, check=True, env={**os.environ, "COLUMNS": "400"}).stdout
    lines = {line.split()[1]: line for line in shown.splitlines() if line[2:4] == "--"}
    for option in options("serve"):
        assert option.name is not None
        if option.name in cli.RENAMED_OPTIONS:
            assert option.hidden and option.opts[0] not in lines, option.name
            continue
        flag = option.opts[0]
        assert f"[env var: {env_var(option.name)}]" in lines[flag], (flag, shown)


def test_a_repeatable_options_env_var_is_read_as_the_settings_read_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GRM_REPLICA_URLS is comma-separated (README); read through the option, it comes split on
    whitespace, and each piece is split on commas as the settings model splits the variable."""
    monkeypatch.setenv("GRM_REPLICA_URLS", "http://a:1,http://b:2 http://c:3")
    assert settings_for("serve", []).replica_urls == ["http://a:1", "http://b:2", "http://c:3"]
    given = settings_for("serve", ["--replica-url", "http://d:4", "--replica-url", "http://e:5"])
    assert given.replica_urls == ["http://d:4", "http://e:5"]


def test_the_old_backend_flag_still_attaches_and_warns_with_the_new_name(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "grm_service"):
        old = settings_for("serve", ["--backend-url", "http://d:4", "--backend-url", "http://e:5"])
    assert old.replica_urls == ["http://d:4", "http://e:5"]
    assert [r.getMessage() for r in caplog.records] == [
        "--backend-url is deprecated and will be removed in the next release: use --replica-url"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, "grm_service"):
        new = settings_for("serve", ["--replica-url", "http://d:4", "--replica-url", "http://e:5"])
    assert new == old and caplog.records == []
    both = settings_for("serve", ["--replica-url", "http://a:1", "--backend-url", "http://b:2"])
    assert both.replica_urls == ["http://a:1"]  # the new name wins


def test_the_old_env_var_still_attaches_through_the_cli_and_warns(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("GRM_BACKEND_URLS", "http://a:1,http://b:2")
    for name in ("serve", "fingerprint", "replica"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, "grm_service"):
            assert settings_for(name, []).replica_urls == ["http://a:1", "http://b:2"]
        assert [r.getMessage() for r in caplog.records] == [
            "GRM_BACKEND_URLS is deprecated and will be removed in the next release: use "
            "GRM_REPLICA_URLS"], name


def test_the_old_verb_runs_the_replica_command_hidden_and_warns(tmp_path: Path) -> None:
    """`grm-service backend` is `grm-service replica` under its old name: the same options, and
    a warning naming the new verb before anything else is said (here: the missing model)."""
    old, new = command("backend"), command("replica")
    assert old.hidden and not new.hidden
    assert [p.name for p in old.params] == [p.name for p in new.params]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRM_")}
    runs = [subprocess.run([sys.executable, "-m", "grm_service.cli", verb,
                            "--model", str(tmp_path / "none"), "--work-dir", str(tmp_path)],
                           capture_output=True, text=True, timeout=120, env=env)
            for verb in ("backend", "replica")]
    assert [run.returncode for run in runs] == [2, 2]  # the model check refuses both
    assert "grm-service backend is deprecated and will be removed in the next release: use " \
        "grm-service replica" in runs[0].stderr
    assert "deprecated" not in runs[1].stderr
    assert "Commands" in (help_ := subprocess.run(
        [sys.executable, "-m", "grm_service.cli", "--help"], capture_output=True, text=True,
        timeout=120, env=env).stdout) and " replica " in help_ and " backend " not in help_


def test_the_start_up_log_names_the_ledger_file_never_a_database_password() -> None:
    path = Settings(model="/m", work_dir="/srv/run/port-8000")
    assert cli.ledger_shown(path) == "/srv/run/port-8000/ledger.sqlite"
    database = Settings(model="/m", ledger_url="postgresql://grm:s3cret@db:5432/ledger")
    assert "s3cret" not in cli.ledger_shown(database)
    assert cli.ledger_shown(Settings(model="/m", ledger=False)) == "off"
