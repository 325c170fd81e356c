"""`grm-service score`: images or a manifest through a running (or a freshly started) service."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

from grm_service.client import AsyncGrmClient, GrmClientError
from grm_service.commands.local_service import ServeSpec, ServiceStartFailed, local_service
from grm_service.commands.manifest import (
    Entry,
    ManifestError,
    load_entries,
    read_prompts,
    sidecar_role,
    with_prompts,
)
from grm_service.commands.results import ResultWriter, format_of, in_input_order, read_rows
from grm_service.config import EngineName
from grm_service.config_parsers import engine_words
from grm_service.errors import ModelNotFound
from grm_service.fingerprint import json_digest
from grm_service.model_source import check_model
from grm_service.scoring.context import ItemError
from grm_service.wire import ItemResult, ScoreItem

log = logging.getLogger(__name__)
console = Console(stderr=True)


@dataclass(frozen=True)
class Job:
    scorer: str
    sampling: dict[str, Any]
    options: dict[str, Any]
    batch_size: int
    concurrency: int
    api_key: str | None = None


def local_error(entry: Entry, message: str) -> ItemResult:
    return ItemResult(id=entry.id, score=None, status="error", error=message,
                      digest=json_digest({"id": entry.id, "score": None, "request_digest": None,
                                          "response_digest": None}))


def build(batch: Sequence[Entry]) -> tuple[list[ScoreItem], dict[str, ItemResult]]:
    """Items to send, and the results of entries that failed before sending (unreadable file)."""
    items, failed = [], {}
    for entry in batch:
        try:
            items.append(entry.item())
        except ItemError as err:
            failed[entry.id] = local_error(entry, str(err))
    return items, failed


async def score_chunk(
    client: AsyncGrmClient, batch: Sequence[Entry], job: Job
) -> list[ItemResult]:
    items, failed = await asyncio.to_thread(build, batch)
    answered = {}
    if items:
        response = await client.score_batch(items, job.scorer, job.sampling, job.options)
        answered = {r.id: r for r in response.results}
    return [failed.get(e.id) or answered[e.id] for e in batch]


async def run(url: str, todo: list[Entry], job: Job, writer: ResultWriter,
              progress: Progress) -> None:
    task = progress.add_task("scoring", total=len(todo))
    chunks = [todo[i : i + job.batch_size] for i in range(0, len(todo), job.batch_size)]
    async with AsyncGrmClient(url, batch_size=job.batch_size, concurrency=job.concurrency,
                              api_key=job.api_key) as client:
        gate = asyncio.Semaphore(await paced(client, job, progress.console))

        async def one(index: int, batch: list[Entry]) -> None:
            async with gate:
                results = await score_chunk(client, batch, job)
            writer.add(index, results)
            progress.advance(task, len(batch))

        async def all_chunks() -> None:
            try:
                async with asyncio.TaskGroup() as group:
                    for index, batch in enumerate(chunks):
                        group.create_task(one(index, batch))
            except ExceptionGroup as failed:
                raise failed.exceptions[0] from None

        await _until_interrupted(all_chunks())


async def paced(client: AsyncGrmClient, job: Job, out: Console) -> int:
    """Batches to keep in flight: --concurrency, within what the service serves at once."""
    capacity = await client.capacity()
    batches = client.in_flight(capacity)
    if capacity is not None and batches < job.concurrency:
        out.print(f"the service serves {capacity.slots} request(s) at once: {batches} "
                  f"batch(es) of {job.batch_size} in flight, not --concurrency "
                  f"{job.concurrency}")
    if capacity is not None and capacity.max_tokens and "max_tokens" not in job.sampling:
        out.print(f"the service's scorers stop at {capacity.max_tokens} tokens here (its "
                  "GRM_SCORE_MAX_TOKENS or its engine's default); --sampling "
                  "'{\"max_tokens\": N}' asks for N")
    return batches


async def _until_interrupted(work: Coroutine[Any, Any, None]) -> None:
    """Run work; Ctrl-C cancels it and raises KeyboardInterrupt. Our own SIGINT handler, not
    asyncio.run's: a task group can absorb the cancellation asyncio.run relies on, and the run
    then finishes as if never interrupted."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        stopper.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise KeyboardInterrupt
    task.result()


@dataclass(frozen=True)
class Summary:
    items: int
    errors: int
    mean: float | None

    def line(self, path: Path) -> str:
        mean = "n/a" if self.mean is None else f"{self.mean:.4f}"
        return f"{self.items} items, mean score {mean}, {self.errors} errors -> {path}"


def summary(path: Path, fmt: str) -> Summary:
    """Counts over the whole output file (with --resume, earlier runs' rows too)."""
    rows = read_rows(path, "csv" if fmt == "csv" else "jsonl")
    scores = [float(r["score"]) for r in rows if r["status"] == "ok"]
    errors = sum(r["status"] == "error" for r in rows)
    return Summary(len(rows), errors, statistics.fmean(scores) if scores else None)


def _json_option(value: str | None, name: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value) if value else {}
    except ValueError as err:
        raise typer.BadParameter(f"not JSON: {err}", param_hint=name) from None
    if not isinstance(parsed, dict):
        raise typer.BadParameter("must be a JSON object", param_hint=name)
    return parsed


def score_command(
    ctx: typer.Context,
    inputs: Annotated[list[str], typer.Argument(help="Image folders, globs, .jsonl/.csv.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Results (.jsonl or .csv).")],
    url: Annotated[str | None, typer.Option(help="A running service.")] = None,
    serve: Annotated[bool, typer.Option(help="Start a service for this run.")] = False,
    model: Annotated[str | None, typer.Option(help="Model for --serve.")] = None,
    replicas: Annotated[int, typer.Option(help="Replicas for --serve.")] = 2,
    engine: Annotated[EngineName | None, typer.Option(
        help="Engine for --serve; default: as `serve` picks (GRM_ENGINE, else vllm where a "
        "CUDA GPU is visible, vllm-cpu otherwise).")] = None,
    dtype: Annotated[str, typer.Option(help="Dtype for --serve.")] = "auto",
    max_model_len: Annotated[int | None, typer.Option(help="Context for --serve.")] = None,
    engine_args: Annotated[str | None, typer.Option(
        help="Engine args for --serve, shell words or a JSON list (default: --enforce-eager).")
    ] = None,
    scorer: Annotated[str, typer.Option(
        help="Registered scorer: ocr, clip, reward_head, judge, classify or a custom one.")
    ] = "ocr",
    prompts: Annotated[Path | None, typer.Option(
        help="Prompt manifest (.jsonl/.csv): rows of `id` (or `image`: the image's path in its "
        "folder) and `prompt`, one for every image.")] = None,
    sidecar: Annotated[str, typer.Option(
        help="What name.txt beside name.png is: prompt | reference | auto (the prompt for "
        "clip and reward_head, the reference otherwise).")] = "auto",
    sampling: Annotated[str | None, typer.Option(help='JSON, e.g. {"max_tokens": 256}.')] = None,
    options: Annotated[str | None, typer.Option(help="Scorer options as JSON.")] = None,
    output_format: Annotated[str | None, typer.Option("--format", help="jsonl | csv.")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Items per request.")] = 8,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight.")] = 4,
    resume: Annotated[bool, typer.Option(help="Skip ids already in --output.")] = False,
    api_key: Annotated[str | None, typer.Option(
        envvar="GRM_API_KEY", help="Key of a service started with GRM_API_KEYS.")] = None,
    allow_errors: Annotated[bool, typer.Option(
        help="Exit 0 even when some items failed (they stay error rows).")] = False,
) -> None:
    """Score images (or a manifest) and write one result per item as they complete.

    Exits 1 when any item failed (unless --allow-errors). Engine args for --serve go in
    --engine-args: after `--` they could not be told from the inputs.
    """
    if bool(url) == serve:
        raise typer.BadParameter("give exactly one of --url and --serve")
    if serve and not model:
        raise typer.BadParameter("--serve needs --model")
    if serve:
        _check_model(str(model))
    flags = [i for i in (*inputs, *ctx.args) if i.startswith("-")]
    if flags:
        raise typer.BadParameter(
            f"{flags[0]!r} is not an input: engine args for --serve go in one option, e.g. "
            f"--engine-args '{' '.join(flags)} ...'", param_hint="INPUTS")
    try:
        entries = load_entries(inputs, sidecar_role(sidecar, scorer))
        if prompts is not None:
            entries = with_prompts(entries, read_prompts(prompts))
        fmt = format_of(output, output_format)
    except (ManifestError, ValueError) as err:
        raise typer.BadParameter(str(err)) from None
    job = Job(scorer, _json_option(sampling, "--sampling"), _json_option(options, "--options"),
              batch_size, concurrency, api_key)
    if url:
        raise typer.Exit(execute(url, entries, job, output, fmt, resume, allow_errors))
    with tempfile.TemporaryDirectory(prefix="grm-score-") as work:
        spec = serve_spec(Path(work), str(model), replicas, engine, dtype, max_model_len,
                          _engine_words(engine_args))
        # The service's own key, where its environment sets keys and --api-key gives none.
        job = dataclasses.replace(job, api_key=job.api_key or spec.api_key())
        try:
            with served(spec) as started:
                code = execute(started, entries, job, output, fmt, resume, allow_errors)
        except ServiceStartFailed as err:
            console.print(f"--serve: the service did not start: {err}", markup=False)
            code = 1
    raise typer.Exit(code)


def _engine_words(text: str | None) -> list[str] | None:
    if text is None:
        return None
    try:
        words = engine_words(text)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--engine-args") from None
    return list(words) if isinstance(words, list) else [str(words)]


def _check_model(model: str) -> None:
    """Before the service starts: its `serve` would refuse the model, a minute later here."""
    try:
        check_model(model, dict(os.environ), Path.cwd())
    except ModelNotFound as err:
        raise typer.BadParameter(err.message, param_hint="--model") from None


@contextlib.contextmanager
def served(spec: ServeSpec, start: Callable[..., contextlib.AbstractContextManager[str]]
           = local_service) -> Iterator[str]:
    """`local_service` (`start`), its start shown as it goes (a minute or more on CPU): the
    gateway, then each replica's state, until every one is ready."""
    began = time.monotonic()
    status = console.status(f"starting a service of {spec.replicas} replica(s) of {spec.model}")
    shown = [""]

    def report(state: str, elapsed_s: float) -> None:
        status.update(f"{state} ({elapsed_s:.0f} s)")
        if state != shown[0]:  # a line per change stays, in a log too (no terminal)
            console.print(f"{elapsed_s:4.0f} s  {state}")
            shown[0] = state

    status.start()
    try:
        with start(spec, report=report) as url:
            status.stop()
            console.print(f"service ready on {url}: {spec.replicas} replica(s) in "
                          f"{time.monotonic() - began:.0f} s (log {spec.work_dir}/gateway.log)")
            yield url
    finally:
        status.stop()


def serve_spec(work_dir: Path, model: str, replicas: int, engine: EngineName | None, dtype: str,
               max_model_len: int | None, engine_args: Sequence[str] | None) -> ServeSpec:
    """The service `--serve` starts; without `--engine` its `serve` picks one as it always does,
    without `--engine-args` the spec's own (eager mode: no graph capture on a short run)."""
    spec = ServeSpec(model=model, work_dir=work_dir, replicas=replicas,
                     engine=engine.value if engine else None, dtype=dtype,
                     max_model_len=max_model_len)
    return spec if engine_args is None else dataclasses.replace(spec,
                                                                engine_args=tuple(engine_args))


def execute(url: str, entries: list[Entry], job: Job, output: Path, fmt: str,
            resume: bool, allow_errors: bool = False) -> int:
    writer = ResultWriter(output, "csv" if fmt == "csv" else "jsonl", resume)
    todo = [e for e in entries if e.id not in writer.done]
    if resume:
        console.print(f"resuming: {len(writer.done)} done, {len(todo)} to score")
    columns = (*Progress.get_default_columns()[:2], BarColumn(), MofNCompleteColumn(),
               TimeRemainingColumn())
    failed = None
    try:
        with Progress(*columns, console=console) as progress:
            asyncio.run(run(url, todo, job, writer, progress))
    except KeyboardInterrupt:
        console.print(f"interrupted: results so far are in {output}; rerun with --resume")
        return 130
    except GrmClientError as err:
        failed = err
    finally:
        writer.close()  # with the results behind a missing batch
    if failed is not None:
        console.print(f"[red]scoring failed:[/red] {failed}")
        console.print(f"{summary(output, fmt).items} results are in {output}; rerun with "
                      "--resume to score the rest")
        return 1
    in_input_order(output, writer.fmt, [e.id for e in entries])
    done = summary(output, fmt)
    console.print(done.line(output))
    if done.errors and not allow_errors:
        console.print(f"[red]{done.errors} of {done.items} items failed[/red] (their rows say "
                      "why); --allow-errors to exit 0 anyway")
        return 1
    return 0
