"""`grm-service demo`: the first command of the README, fully offline.

It builds (or reuses) the tiny random VLM, serves it on CPU replicas, scores the sample images
shipped in `grm_service/samples/` with the `ocr` scorer, prints scores and fingerprints, and
stops everything. The model is random, so its transcripts and scores mean nothing: the point is
that they are reproducible, bit for bit, with the same fingerprint. It ends with the model's path
and the `serve` and `score` commands that give that fingerprint and those transcripts by hand,
printed from the same spec the demo started its service from.
"""

from __future__ import annotations

import json
import shlex
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from grm_service.client import GrmClient
from grm_service.commands.local_service import ServeSpec, ServiceStartFailed, local_service
from grm_service.commands.manifest import load_entries
from grm_service.tiny_models import ensure_tiny_model
from grm_service.wire import ItemResult

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "manifest.jsonl"
# Qwen2-VL's processor wants image and video limits; the tiny model's context is 512 tokens.
ENGINE_ARGS = ("--enforce-eager", "--limit-mm-per-prompt", '{"image": 8, "video": 0}')
# The service's default seed, written out: a GRM_SEED in the shell changes neither the demo nor
# the command it prints to reproduce it.
SEED = 42
PORT = 8000


def demo_spec(model: Path, replicas: int, work_dir: Path) -> ServeSpec:
    """The demo's service. Every setting its fingerprint depends on is a flag here (engine,
    dtype, context length, eager mode, seed), so the command printed from it is the service."""
    return ServeSpec(model=str(model), work_dir=work_dir, replicas=replicas, engine="vllm-cpu",
                     dtype="float32", max_model_len=512, engine_args=ENGINE_ARGS, seed=SEED)


def score_line(sampling: dict[str, int], port: int = PORT) -> str:
    """The `grm-service score` that sends the demo's requests: its samples, its sampling."""
    return shlex.join(["grm-service", "score", str(SAMPLES), "--url", f"http://127.0.0.1:{port}",
                       "--sampling", json.dumps(sampling), "-o", "scores.jsonl"])


def print_reproduction(console: Console, spec: ServeSpec, sampling: dict[str, int]) -> None:
    console.print(f"The demo's model: {spec.model}")
    console.print("The same service by hand (the same fingerprint id; with the score command, "
                  "the same transcripts):")
    console.print(spec.command_line(PORT), markup=False, highlight=False, soft_wrap=True)
    console.print(score_line(sampling), markup=False, highlight=False, soft_wrap=True)


def table(results: list[ItemResult], references: dict[str, str]) -> Table:
    ids = sorted({r.fingerprint.fingerprint_id for r in results if r.fingerprint})
    out = Table(title="OCR scores of a tiny RANDOM model: the scores are meaningless, "
                      "the fingerprints are the point",
                caption=f"fingerprint id: {', '.join(ids) or 'none'}")
    for name in ("id", "reference", "transcript", "score", "response digest", "replica"):
        out.add_column(name, overflow="fold")
    for r in results:
        fp = r.fingerprint
        transcript = r.response if isinstance(r.response, str) else r.error or ""
        out.add_row(r.id, references.get(r.id, ""), repr(transcript[:24]),
                    "error" if r.score is None else f"{r.score:.3f}",
                    fp.response_digest[:12] if fp else "", fp.replica if fp else "")
    return out


def demo_command(
    replicas: Annotated[int, typer.Option(min=1, help="CPU replicas to start.")] = 2,
    max_tokens: Annotated[int, typer.Option(min=1, help="Transcript length cap.")] = 32,
    repeat: Annotated[int, typer.Option(min=1, help="Score the samples this many times.")] = 1,
) -> None:
    """Serve a tiny random VLM on CPU and OCR-score the bundled sample images."""
    console = Console()
    entries = load_entries([str(SAMPLES)])
    references = {e.id: e.reference or "" for e in entries}
    console.print("building (or reusing) the tiny random VLM ...")
    model = ensure_tiny_model("vlm")
    console.print(f"model: {model}")
    items = [e.item() for e in entries]
    sampling = {"max_tokens": max_tokens}
    with tempfile.TemporaryDirectory(prefix="grm-demo-") as work:
        spec = demo_spec(model, replicas, Path(work))
        console.print(f"starting {replicas} vllm-cpu replicas (about a minute) ...")
        try:
            with local_service(spec) as url, GrmClient(url, batch_size=len(items),
                                                       api_key=spec.api_key()) as client:
                start = time.perf_counter()
                for _ in range(repeat):
                    results = client.score(items, "ocr", sampling=sampling)
                elapsed = time.perf_counter() - start
        except ServiceStartFailed as err:
            console.print(f"the demo's service did not start: {err}", markup=False)
            raise typer.Exit(1) from None
    console.print(table(results, references))
    rate = len(items) * repeat / elapsed
    console.print(f"{len(items) * repeat} images in {elapsed:.2f} s: {rate:.2f} images/s "
                  f"({replicas} CPU replicas, max_tokens {max_tokens})")
    console.print("Random weights: the scores say nothing about OCR quality. Run it again: "
                  "the transcripts, scores and digests will be identical.")
    print_reproduction(console, spec, sampling)
