"""`grm-service verify` and `grm-service diff`: the commands around verify.py and diffing.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from grm_service.commands.diffing import diff_runs, load_results
from grm_service.commands.prober import (
    DEFAULT_CONCURRENCY,
    AccessRefused,
    Report,
    Row,
    verify,
)
from grm_service.probes import builtin_probes, load_manifest

console = Console()


def _print_row(row: Row) -> None:
    mark = "[green]ok[/green]" if row.complete else "[red]DIFFERS[/red]"
    console.print(f"  {row.condition:<28} {row.identical:>4}/{row.total:<4} {mark}")


def _print_mismatch(row: Row) -> None:
    assert row.first_mismatch is not None
    index, ref, got = row.first_mismatch
    console.print(f"\n[bold red]{row.condition}[/bold red]: first differing item #{index}")
    for label, outcome in (("reference", ref), (row.condition, got)):
        console.print(f"[bold]{label}[/bold] output:", json.dumps(outcome["output"])[:2000])
        console.print(f"[bold]{label}[/bold] digest: {outcome['digest']}")
        console.print(f"[bold]{label}[/bold] fingerprint:", json.dumps(outcome["fingerprint"]))


def _verdict(report: Report) -> None:
    """One closing line: each row was printed once, as it completed."""
    differ = sum(not row.complete for row in report.rows)
    if not differ:
        console.print(f"[green]all {len(report.rows)} conditions bitwise identical to the "
                      "reference run[/green]")
    else:
        console.print(f"[red]{differ} of {len(report.rows)} conditions differ[/red] (the "
                      "first differing item of each below)")


def verify_command(
    url: Annotated[str, typer.Option(help="Service to check, e.g. http://127.0.0.1:8000.")],
    manifest: Annotated[
        Path | None, typer.Option(help="JSONL of chat-completion bodies (real items).")
    ] = None,
    probes: Annotated[int, typer.Option(min=1, help="Built-in probe count.")] = 16,
    max_tokens: Annotated[int | None, typer.Option(help="Override probe max_tokens.")] = None,
    timeout: Annotated[float, typer.Option(help="Per-request timeout, seconds.")] = 600,
    api_key: Annotated[str | None, typer.Option(
        envvar="GRM_API_KEY", help="Key of a service started with GRM_API_KEYS.")] = None,
    concurrency: Annotated[int, typer.Option(
        min=1, help="Requests in flight at once in the loaded conditions, on the service and "
        "on each replica alone.")] = DEFAULT_CONCURRENCY,
) -> None:
    """Send a probe set under several conditions; exit 0 only if every row is complete
    (2: the service refused the key)."""
    try:
        bodies = load_manifest(manifest) if manifest else builtin_probes(probes, max_tokens)
    except (OSError, ValueError) as err:
        raise typer.BadParameter(str(err), param_hint="--manifest") from None
    raise typer.Exit(check(url, bodies, timeout, api_key, concurrency))


def check(url: str, bodies: list[dict[str, Any]], timeout: float, api_key: str | None,
          concurrency: int, transport: httpx.AsyncBaseTransport | None = None) -> int:
    """Run the conditions, print each row once as it completes and a verdict; the exit code."""
    console.print(f"verifying {url} with {len(bodies)} probe item(s), {concurrency} in flight "
                  "when loaded (items bitwise identical to the reference run / total)")
    try:
        report = asyncio.run(verify(url, bodies, timeout, on_row=_print_row, api_key=api_key,
                                    concurrency=concurrency, transport=transport))
    except AccessRefused as err:
        console.print(f"[red]{err}[/red]")
        return 2
    _verdict(report)
    for row in report.rows:
        if row.first_mismatch is not None:
            _print_mismatch(row)
    return 0 if report.ok else 1


def _identity(path: Path | None) -> dict[str, object] | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise typer.BadParameter(f"{path}: {err}") from None
    return data if isinstance(data, dict) else None


def diff_command(
    a: Annotated[Path, typer.Argument(help="First results file (JSONL from `score`).")],
    b: Annotated[Path, typer.Argument(help="Second results file.")],
    identity_a: Annotated[Path | None, typer.Option(help="GET /v1/fingerprint of run A.")] = None,
    identity_b: Annotated[Path | None, typer.Option(help="GET /v1/fingerprint of run B.")] = None,
) -> None:
    """Compare two scoring outputs item by item and say why each difference happened."""
    try:
        run_a, run_b = load_results(a), load_results(b)
    except (OSError, ValueError) as err:
        raise typer.BadParameter(str(err)) from None
    ident_a, ident_b = _identity(identity_a), _identity(identity_b)
    identities = (ident_a, ident_b) if ident_a is not None and ident_b is not None else None
    diffs = diff_runs(run_a, run_b, identities)
    table = Table(title=f"{len(diffs)} of {len(set(run_a) | set(run_b))} item(s) differ")
    for column in ("id", "cause", "detail"):
        table.add_column(column, overflow="fold")
    for d in diffs:
        table.add_row(d.id, d.cause, d.detail)
    console.print(table)
    raise typer.Exit(1 if diffs else 0)
