"""`grm-service ledger ...`: the ledger read back, from its file or its PostgreSQL database.

    grm-service ledger runs                       runs, their steps and request counts
    grm-service ledger steps RUN                  one run's steps
    grm-service ledger records --run R --steps 10:12 [--request-digest D] [--limit N | --all]
    grm-service ledger show ID                    one request: its body, answer, fingerprint
    grm-service ledger export OUT.jsonl --run R   rows `grm-service diff` reads
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from grm_service.errors import LedgerUnavailable
from grm_service.ledger.location import open_store
from grm_service.ledger.query import (
    all_records,
    detail,
    export_rows,
    nothing_selected,
    parse_steps,
    summary,
)
from grm_service.ledger.store import Selection, Store
from grm_service.work_dir import LEDGER_FILE, ledgers_below, run_root

ledger_app = typer.Typer(no_args_is_help=True, help="Read the reward ledger back.")
console = Console()


def default_location(root: Path | None = None) -> str:
    """Where `serve` keeps it by default: in its own work dir below the run root (work_dir.py).
    One such ledger is read without naming it; of several, none is picked by guess."""
    root = root or run_root()
    found = ledgers_below(root)
    if len(found) > 1:
        raise typer.BadParameter(
            f"{len(found)} services keep a ledger below {root}: "
            + ", ".join(map(str, found)) + "; name one with --ledger", param_hint="--ledger")
    return str(found[0] if found else root / LEDGER_FILE)


Location = Annotated[str | None, typer.Option(
    "--ledger", envvar="GRM_LEDGER_URL",
    help="SQLite file or postgresql:// URL (default: the serve default).")]
Run = Annotated[str | None, typer.Option(help="Run tag; '' = untagged requests.")]
Steps = Annotated[str | None, typer.Option(help="Steps a:b (both included), a:, :b or a.")]
RECORD_COLUMNS = ["id", "run", "step", "route", "request_digest", "response_digest", "cache"]


@contextmanager
def opened(location: str | None, readonly: bool = True) -> Iterator[Store]:
    where = location or default_location()
    try:
        store = open_store(where, readonly=readonly)
    except LedgerUnavailable as err:
        raise typer.BadParameter(err.message, param_hint="--ledger") from None
    try:
        yield store
    finally:
        store.close()


def selection(run: str | None, steps: str | None, digest: str | None = None) -> Selection:
    try:
        first, last = parse_steps(steps)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--steps") from None
    return Selection(None, run, first, last, digest)


def _table(title: str, rows: list[dict[str, object]], columns: list[str]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    console.print(table)


@ledger_app.command()
def runs(ledger: Location = None) -> None:
    """Every run on record (untagged requests under '')."""
    with opened(ledger) as store:
        found = store.runs()
    _table("runs", list(found), ["run", "requests", "cached", "first_step", "last_step"])


@ledger_app.command()
def steps(run: Annotated[str, typer.Argument(help="The run tag.")],
          ledger: Location = None) -> None:
    """One run's steps and their request counts."""
    with opened(ledger) as store:
        found = store.steps(run)
    _table(f"steps of {run!r}", list(found), ["step", "requests"])


@ledger_app.command()
def records(
    run: Run = None, steps: Steps = None,
    request_digest: Annotated[str | None, typer.Option(
        help="The request behind a reward: its fingerprint's request_digest.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Records in the table.")] = 100,
    every: Annotated[bool, typer.Option(
        "--all", help="Every selected record, streamed as tab-separated lines.")] = False,
    ledger: Location = None,
) -> None:
    """The records of a run, steps or request, oldest first."""
    chosen = selection(run, steps, request_digest)
    with opened(ledger) as store:
        if every:
            _stream(summary(r) for r in all_records(store, chosen))
            return
        found = store.records(chosen, limit + 1)  # one more: whether the table holds them all
        total = store.count(chosen) if len(found) > limit else None
        empty = nothing_selected(store, run, steps, request_digest) if not found else ""
    _table("records", [summary(r) for r in found[:limit]], RECORD_COLUMNS)
    if len(found) > limit:
        of = "" if total is None else f" of {total}"
        console.print(f"showing the first {limit}{of} records: --limit N shows more, --all "
                      "every one (streamed), `grm-service ledger export` writes them as JSONL")
    elif empty:
        console.print(empty)


def _stream(rows: Iterator[dict[str, object]]) -> None:
    """Tab-separated lines, a page of the store at a time: memory bounded whatever the count."""
    sys.stdout.write("\t".join(RECORD_COLUMNS) + "\n")
    for row in rows:
        sys.stdout.write("\t".join("" if row.get(c) is None else str(row.get(c))
                                   for c in RECORD_COLUMNS) + "\n")


@ledger_app.command()
def show(record_id: Annotated[int, typer.Argument(help="Record id (from `records`).")],
         ledger: Location = None) -> None:
    """One request whole, as JSON: the body the engine was sent, its answer, its fingerprint."""
    with opened(ledger) as store:
        found = store.record(record_id)
    if found is None:
        raise typer.BadParameter(f"no record {record_id}", param_hint="RECORD_ID")
    sys.stdout.write(json.dumps(detail(found), indent=2, ensure_ascii=False) + "\n")


@ledger_app.command()
def export(out: Annotated[Path, typer.Argument(help="JSONL file to write.")], run: Run = None,
           steps: Steps = None, ledger: Location = None) -> None:
    """Write the selected records as JSONL rows that `grm-service diff` compares."""
    count = 0
    with opened(ledger) as store, out.open("w", encoding="utf-8") as handle:
        for row in export_rows(all_records(store, selection(run, steps))):
            handle.write(json.dumps(row) + "\n")
            count += 1
    console.print(f"{count} record(s) written to {out}")


@ledger_app.command()
def upgrade(ledger: Location = None) -> None:
    """Move a ledger of an earlier layout into this version's (a gateway does it when it opens
    one); a ledger of this layout is left as it is."""
    with opened(ledger, readonly=False) as store:
        found = store.runs()
    console.print(f"ledger of this layout: {sum(r['requests'] for r in found)} record(s)")
