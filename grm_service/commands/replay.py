"""`grm-service replay LEDGER --url URL`: a recorded run against a deployment (replayer.py)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from grm_service.client import auth_headers
from grm_service.commands.ledger import opened, selection
from grm_service.commands.replayer import Report, lines, replay

console = Console()


def _print(report: Report) -> None:
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
    causes = Table(title=f"{report.total - report.matched} difference(s), by cause")
    for column in ("cause", "count", "first record", "detail"):
        causes.add_column(column, overflow="fold")
    for cause, count in report.causes.most_common():
        example = report.examples[cause]
        causes.add_row(cause, str(count), str(example.record.id), example.detail[:300])
    console.print(causes)


def replay_command(
    ledger: Annotated[str, typer.Argument(help="The ledger: SQLite file or postgresql:// URL.")],
    url: Annotated[str, typer.Option(help="Deployment to replay against.")],
    run: Annotated[str | None, typer.Option(help="Only this run ('' = untagged).")] = None,
    steps: Annotated[str | None, typer.Option(help="Only steps a:b (both included).")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight.")] = 64,
    api_key: Annotated[str | None, typer.Option(envvar="GRM_API_KEY",
                                                help="Key of the deployment.")] = None,
    timeout: Annotated[float, typer.Option(help="Per-request timeout, seconds.")] = 600,
) -> None:
    """Re-send recorded requests and compare every answer bit for bit; exit 0 only if all
    match."""
    chosen = selection(run, steps)
    with opened(ledger) as store:
        report = asyncio.run(replay(store, chosen, url, concurrency, auth_headers(api_key),
                                    timeout))
    _print(report)
    raise typer.Exit(0 if report.ok else 1)
