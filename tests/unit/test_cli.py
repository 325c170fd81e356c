"""The command line: every option of the commands that build Settings is an env var, shown in
--help, and read as the settings model reads it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grm_service import cli
from grm_service.config import Settings
from tests.support.cli import options, settings_for

SETTINGS_COMMANDS = ("serve", "backend", "fingerprint")


def env_var(option: str) -> str:
    """The variable the settings model reads for the option's field (GRM_<FIELD>)."""
    field = cli.FIELD_OF.get(option, option)
    assert field in Settings.model_fields or field in cli.CLI_ONLY, option
    return cli.CLI_ONLY.get(field) or f"GRM_{field.upper()}"


@pytest.mark.parametrize("name", SETTINGS_COMMANDS)
def test_every_option_has_the_env_var_of_its_setting(name: str) -> None:
    """A new option without an env var, or with one the settings model does not read, fails."""
    found = options(name)
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
        flag = option.opts[0]
        assert f"[env var: {env_var(option.name)}]" in lines[flag], (flag, shown)


def test_a_repeatable_options_env_var_is_read_as_the_settings_read_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GRM_BACKEND_URLS is comma-separated (README); read through the option, it comes split on
    whitespace, and each piece is split on commas as the settings model splits the variable."""
    monkeypatch.setenv("GRM_BACKEND_URLS", "http://a:1,http://b:2 http://c:3")
    assert settings_for("serve", []).backend_urls == ["http://a:1", "http://b:2", "http://c:3"]
    given = settings_for("serve", ["--backend-url", "http://d:4", "--backend-url", "http://e:5"])
    assert given.backend_urls == ["http://d:4", "http://e:5"]


def test_the_start_up_log_names_the_ledger_file_never_a_database_password() -> None:
    path = Settings(model="/m", work_dir="/srv/run/port-8000")
    assert cli.ledger_shown(path) == "/srv/run/port-8000/ledger.sqlite"
    database = Settings(model="/m", ledger_url="postgresql://grm:s3cret@db:5432/ledger")
    assert "s3cret" not in cli.ledger_shown(database)
    assert cli.ledger_shown(Settings(model="/m", ledger=False)) == "off"
