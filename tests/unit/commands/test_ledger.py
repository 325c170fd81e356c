"""`grm-service ledger` on a real SQLite file: an earlier layout named, then upgraded; what
`records` shows of a selection."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from typer.testing import CliRunner

from grm_service.commands.ledger import ledger_app
from grm_service.ledger.location import open_store
from tests.unit.ledger.test_store import record
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


def ledger_of(path: Path, n: int, run: str = "r") -> str:
    """A real SQLite ledger of `n` records of one run, a step each."""
    store = open_store(str(path))
    try:
        store.write([record(i, run=run, step=i) for i in range(1, n + 1)])
    finally:
        store.close()
    return str(path)


def test_records_says_when_the_table_shows_some_and_all_streams_every_one(
        tmp_path: Path) -> None:
    path = ledger_of(tmp_path / "l.sqlite", 130)
    runner = CliRunner()
    wide = {"COLUMNS": "250"}
    some = runner.invoke(ledger_app, ["records", "--ledger", path], env=wide)
    assert some.exit_code == 0 and "showing the first 100 of 130 records" in some.output
    assert "--all" in some.output and "--limit" in some.output
    more = runner.invoke(ledger_app, ["records", "--ledger", path, "--limit", "130"], env=wide)
    assert more.exit_code == 0 and "showing" not in more.output and "req130" in more.output
    streamed = runner.invoke(ledger_app, ["records", "--ledger", path, "--all"])
    lines = streamed.output.splitlines()
    assert streamed.exit_code == 0 and lines[0].split("\t")[:3] == ["id", "run", "step"]
    assert [line.split("\t")[4] for line in lines[1:]] == [f"req{i}" for i in range(1, 131)]
    steps = runner.invoke(ledger_app, ["records", "--ledger", path, "--steps", "5:9", "--all"])
    assert len(steps.output.splitlines()) == 6


def test_records_of_an_empty_selection_name_the_runs_on_record(tmp_path: Path) -> None:
    path = ledger_of(tmp_path / "l.sqlite", 3, run="grpo")
    found = CliRunner().invoke(ledger_app, ["records", "--ledger", path, "--run", "nope"],
                               env={"COLUMNS": "250"})
    assert found.exit_code == 0, found.output
    assert "no record selected by --run 'nope'; runs on record: 'grpo': 3 record(s), steps 1:3" \
        in found.output
