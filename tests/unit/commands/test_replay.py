"""`grm-service replay` on a real SQLite ledger: an empty selection is a usage error naming the
runs on record; every differing record is named, on the screen (bounded) or in a file.

The deployment replayed against is the STUB replica itself: its answers carry no grm-service
fingerprint, so every record differs, all for one cause: the case where records grouped by
cause could not be told apart."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from grm_service.commands.replay import replay_command
from grm_service.commands.replayer import SHOWN
from grm_service.ledger.location import open_store
from grm_service.ledger.records import Origin, Record
from tests.support.procs import Proc, free_port

WIDE = {"COLUMNS": "250"}
NOT_OURS = "answer is not a grm-service answer"


def replay_app() -> typer.Typer:
    app = typer.Typer()
    app.command()(replay_command)
    return app


def chat_record(n: int, run: str) -> Record:
    body = json.dumps({"messages": [{"role": "user", "content": f"q{n}"}], "seed": 1}).encode()
    return Record(float(n), Origin("/v1/chat/completions", "", run, n), "/v1/chat/completions",
                  "grm-1", f"req{n}", f"resp{n}", body, b'{"choices":[]}',
                  {"fingerprint_id": "grm-1", "request_digest": f"req{n}",
                   "response_digest": f"resp{n}"})


def ledger_of(path: Path, n: int, run: str = "grpo") -> str:
    store = open_store(str(path))
    try:
        store.write([chat_record(i, run) for i in range(1, n + 1)])
    finally:
        store.close()
    return str(path)


def test_an_empty_selection_is_a_usage_error_naming_the_runs(tmp_path: Path) -> None:
    path = ledger_of(tmp_path / "l.sqlite", 4)
    empty = ledger_of(tmp_path / "empty.sqlite", 0)
    nowhere = f"http://127.0.0.1:{free_port()}"  # never reached: refused before any request
    runner = CliRunner()
    untagged = runner.invoke(replay_app(), [path, "--url", nowhere, "--run", ""], env=WIDE)
    steps = runner.invoke(replay_app(), [path, "--url", nowhere, "--steps", "50:60"], env=WIDE)
    none = runner.invoke(replay_app(), [empty, "--url", nowhere], env=WIDE)
    for result in (untagged, steps, none):
        assert result.exit_code == 2, result.output
    assert "--run ''" in untagged.output and "'grpo': 4 record(s)" in untagged.output
    assert "ledger runs" in untagged.output
    assert "--steps 50:60" in steps.output and "'grpo'" in steps.output
    assert "holds no records" in none.output


def test_every_differing_record_is_named_on_screen_bounded_and_in_a_file(
        stub: Proc, tmp_path: Path) -> None:
    total = SHOWN + 5
    path = ledger_of(tmp_path / "l.sqlite", total)
    runner = CliRunner()
    screen = runner.invoke(replay_app(), [path, "--url", stub.url, "--concurrency", "4"],
                           env=WIDE)
    assert screen.exit_code == 1, screen.output
    named = [line.split("│")[1:5] for line in screen.output.splitlines()
             if line.count("│") > 5 and NOT_OURS in line]
    assert [[cell.strip() for cell in row] for row in named] == [
        [str(n), "grpo", str(n), f"req{n}"] for n in range(1, SHOWN + 1)]
    assert "5 more: --differences FILE" in screen.output
    out = tmp_path / "differences.jsonl"
    written = runner.invoke(replay_app(), [path, "--url", stub.url, "--differences", str(out)],
                            env=WIDE)
    assert written.exit_code == 1 and f"every difference ({total}) written to" in written.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["record"], r["request_digest"], r["run"], r["step"], r["cause"])
            for r in rows] == [(n, f"req{n}", "grpo", n, NOT_OURS) for n in range(1, total + 1)]
