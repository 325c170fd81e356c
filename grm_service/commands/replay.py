"""`grm-service replay LEDGER --url URL`: a recorded run against a deployment (replayer.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from grm_service.client import auth_headers
from grm_service.commands.ledger import opened, selection
from grm_service.commands.replayer import Report, lines, replay
from grm_service.ledger.query import nothing_selected
from grm_service.ledger.store import Selection, Store

console = Console()
_DETAIL = 60  # a difference's detail on the screen, a line each (the file keeps it whole)


def _print(report: Report, written: Path | None) -> None:
    table = Table(title="replay (answers bitwise identical to the record)")
    for column in ("run", "identical", "total", "complete"):
        table.add_column(column)
    for row in lines(report):
        table.add_row(*row)
    console.print(table)
    if report.no_body:
        console.print(f"{report.no_body} record(s) skipped: kept as digests only "
                      "(GRM_LEDGER_BODIES)")
    if not report.causes:
        return
    causes = Table(title=f"{report.differing} difference(s), by cause")
    for column in ("cause", "count"):
        causes.add_column(column, overflow="fold")
    for cause, count in report.causes.most_common():
        causes.add_row(cause, str(count))
    console.print(causes)
    _print_differences(report, written)


def _print_differences(report: Report, written: Path | None) -> None:
    """Each differing record by its id, request digest, run and step: the first `shown` here,
    every one in the file `--differences` names."""
    shown = report.differences
    table = Table(title=f"differing records ({len(shown)} of {report.differing}, oldest first)")
    for column in ("record", "run", "step", "request digest", "cause"):
        table.add_column(column, overflow="fold")
    table.add_column("detail", overflow="ellipsis", no_wrap=True, max_width=_DETAIL)
    for row in shown:
        table.add_row(str(row["record"]), row["run"] or "(untagged)",
                      "" if row["step"] is None else str(row["step"]), row["request_digest"],
                      row["cause"], row["detail"][:_DETAIL])
    console.print(table)
    if written is not None:
        console.print(f"every difference ({report.differing}) written to {written}, one JSON "
                      "line each (`grm-service ledger show ID` shows a record whole)")
    elif report.differing > len(shown):
        console.print(f"{report.differing - len(shown)} more: --differences FILE writes every "
                      "one, with its cause and detail")


def _require_some(store: Store, chosen: Selection, run: str | None, steps: str | None) -> None:
    """An empty selection is a usage error naming the runs on record, not an empty replay."""
    if not store.records(chosen, 1):
        raise typer.BadParameter(nothing_selected(store, run, steps), param_hint="--run/--steps")


@contextmanager
def _report(path: Path | None) -> Iterator[Report]:
    """A report whose every difference goes to the file at `path` as it is found (a JSON line
    each: memory bounded whatever the count)."""
    if path is None:
        yield Report()
        return
    with path.open("w", encoding="utf-8") as handle:

        def write(row: dict[str, Any]) -> None:
            handle.write(json.dumps(row) + "\n")

        yield Report(sink=write)


def replay_command(
    ledger: Annotated[str, typer.Argument(help="The ledger: SQLite file or postgresql:// URL.")],
    url: Annotated[str, typer.Option(help="Deployment to replay against.")],
    run: Annotated[str | None, typer.Option(help="Only this run ('' = untagged).")] = None,
    steps: Annotated[str | None, typer.Option(help="Only steps a:b (both included).")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight.")] = 64,
    api_key: Annotated[str | None, typer.Option(envvar="GRM_API_KEY",
                                                help="Key of the deployment.")] = None,
    timeout: Annotated[float, typer.Option(help="Per-request timeout, seconds.")] = 600,
    differences: Annotated[Path | None, typer.Option(
        help="JSONL file naming every differing record: id, request digest, run, step, cause, "
        "detail.")] = None,
) -> None:
    """Re-send recorded requests and compare every answer bit for bit; exit 0 only if all
    match."""
    chosen = selection(run, steps)
    with opened(ledger) as store:
        _require_some(store, chosen, run, steps)
        with _report(differences) as report:
            asyncio.run(replay(store, chosen, url, concurrency, auth_headers(api_key), timeout,
                               report))
    _print(report, differences)
    raise typer.Exit(0 if report.ok else 1)
