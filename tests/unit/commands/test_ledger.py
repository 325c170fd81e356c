"""`grm-service ledger` on a real SQLite file: an earlier layout named, then upgraded."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from typer.testing import CliRunner

from grm_service.commands.ledger import ledger_app
from tests.unit.ledger.test_upgrade import _first_schema_ledger


def test_an_earlier_layout_is_named_then_upgraded_and_read(tmp_path: Path) -> None:
    path = str(tmp_path / "old.sqlite")
    _first_schema_ledger(path)
    runner = CliRunner()
    refused = runner.invoke(ledger_app, ["runs", "--ledger", path])
    assert refused.exit_code == 2 and "earlier layout" in refused.output
    upgraded = runner.invoke(ledger_app, ["upgrade", "--ledger", path])
    assert upgraded.exit_code == 0 and "1 record(s)" in upgraded.output, upgraded.output
    listed = runner.invoke(ledger_app, ["records", "--ledger", path])
    assert listed.exit_code == 0 and "req0" in listed.output, listed.output


def test_a_file_that_holds_no_ledger_is_named(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE x (y)")
    refused = CliRunner().invoke(ledger_app, ["runs", "--ledger", str(path)])
    assert refused.exit_code == 2 and "holds no ledger" in refused.output
