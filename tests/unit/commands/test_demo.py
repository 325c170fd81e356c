"""`grm-service demo` prints the `serve` and `score` commands that reproduce it by hand: the same
fingerprint id, the same requests. Checked through the CLI's own parser and the identity function
replicas run on themselves. The demo itself runs on a STUB replica: no model is built, no engine
started."""

from __future__ import annotations

import io
import json
import re
import shlex
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from rich.console import Console

from grm_service.commands import demo
from grm_service.commands.demo import PORT, SAMPLES, SEED, demo_spec, score_line, table
from grm_service.commands.manifest import load_entries
from grm_service.commands.replica import replica_identity
from grm_service.config import Settings
from grm_service.wire import ItemResult
from tests.support.cli import command, settings_for
from tests.support.procs import Proc, received


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model folder (what is hashed is its files), the hash cache in the test's folder."""
    folder = tmp_path / "vlm"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen2_vl"}')
    monkeypatch.setenv("GRM_CACHE_DIR", str(tmp_path / "cache"))
    return folder


def fingerprint_id(settings: Settings) -> str:
    return replica_identity(settings).fingerprint_id(settings.seed)


def test_the_printed_serve_command_is_the_demos_service(tmp_path: Path, model: Path) -> None:
    spec = demo_spec(model, 2, tmp_path / "work")
    printed = shlex.split(spec.command_line())
    assert printed[:2] == ["grm-service", "serve"]
    child = spec.argv(8123)  # what the demo itself starts
    assert child[1:4] == ["-m", "grm_service.cli", "serve"]
    by_hand, in_demo = settings_for("serve", printed[2:]), settings_for("serve", child[4:])
    assert by_hand.model == in_demo.model == str(model)
    assert replica_identity(by_hand) == replica_identity(in_demo)
    assert fingerprint_id(by_hand) == fingerprint_id(in_demo)
    # The demo's settings are not serve's defaults: without them, another fingerprint.
    bare = settings_for("serve", ["--model", str(model), "--engine", "vllm-cpu"])
    assert fingerprint_id(bare) != fingerprint_id(in_demo)
    numerics = replica_identity(by_hand).env_inputs["numerics"]
    assert (numerics["dtype"], numerics["max_model_len"], numerics["enforce_eager"]) == (
        "float32", 512, True)


def test_the_shells_settings_change_neither(
        tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GRM_* variables in the shell reach the demo's service and the one typed by hand alike:
    each input of the fingerprint is a flag of the printed command, so they cannot change it."""
    spec = demo_spec(model, 2, tmp_path / "work")
    clean = fingerprint_id(settings_for("serve", shlex.split(spec.command_line())[2:]))
    for name, value in (("GRM_SEED", "7"), ("GRM_DTYPE", "bfloat16"), ("GRM_ENGINE", "vllm"),
                        ("GRM_MAX_MODEL_LEN", "4096"), ("GRM_ENGINE_ARGS", "--max-num-seqs 4")):
        monkeypatch.setenv(name, value)
    by_hand = settings_for("serve", shlex.split(spec.command_line())[2:])
    assert by_hand.seed == SEED
    assert fingerprint_id(by_hand) == clean
    assert fingerprint_id(settings_for("serve", spec.argv(8123)[4:])) == clean


def test_the_printed_score_command_sends_the_demos_requests() -> None:
    """The same items (the bundled samples), scorer and sampling: the same transcripts."""
    sampling = {"max_tokens": 32}
    printed = shlex.split(score_line(sampling))
    assert printed[:2] == ["grm-service", "score"]
    with command("score").make_context("score", printed[2:]) as ctx:
        params = ctx.params
    assert params["inputs"] == [str(SAMPLES)] and params["scorer"] == "ocr"
    assert json.loads(params["sampling"]) == sampling
    assert params["url"] == "http://127.0.0.1:8000"


def test_the_readme_serves_the_demo_model_as_the_demo_prints_it() -> None:
    """The README's first screen takes a newcomer from the demo to their own folder with the
    demo's `serve` command: it must stay the command the demo prints (the model in the default
    cache, written with `~`)."""
    from grm_service.tiny_models import BUILDER_VERSION

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    model = Path("~/.cache/grm-service/tiny-models") / f"vlm-b{BUILDER_VERSION}"
    # shlex quotes `~`; the README leaves it to the shell to expand.
    line = demo_spec(model, 2, Path("work")).command_line().replace(f"'{model}'", str(model))
    assert f"\n.venv/bin/{line}\n" in readme


def rows(printed: str) -> list[list[str]]:
    """The body rows of the table rich drew (its header's bars are heavy, its rows' light)."""
    return [[cell.strip() for cell in line.split("│")[1:-1]]
            for line in printed.splitlines() if line.startswith("│")]


def test_an_item_that_failed_shows_why_and_no_fingerprint() -> None:
    failed = ItemResult(id="a", score=None, status="error", error="replica timed out",
                        digest="d")
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(table([failed], {"a": "HELLO"}))
    printed = console.export_text()
    assert rows(printed) == [["a", "HELLO", "'replica timed out'", "error", "", ""]]
    assert "fingerprint id: none" in printed


@pytest.fixture
def demo_on_stub(model: Path, stub: Proc, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The demo with nothing built and no engine: its tiny model is the test's folder and its
    service attaches to the STUB replica (GRM_* in the shell reach it, as a user's would). It
    yields the folder the demo's temporary work dir goes in."""
    def built(kind: str) -> Path:
        assert kind == "vlm"
        return model

    monkeypatch.setattr(demo, "ensure_tiny_model", built)
    monkeypatch.setenv("GRM_REPLICA_URLS", stub.url)
    monkeypatch.setenv("GRM_SERVED_MODEL_NAME", "rm")  # the STUB's
    # A repeated item is answered from the ledger otherwise: each round must reach the replica
    # to be counted there.
    monkeypatch.setenv("GRM_LEDGER_CACHE_SCORE", "false")
    monkeypatch.setenv("COLUMNS", "250")  # a table row on one line
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    received([stub], clear=True)
    yield temp


def test_the_demo_scores_the_samples_and_prints_how_to_do_it_by_hand(
        demo_on_stub: Path, model: Path, stub: Proc, capsys: pytest.CaptureFixture[str]) -> None:
    entries = load_entries([str(SAMPLES)])
    demo.demo_command(replicas=1, max_tokens=8, repeat=2)
    printed = capsys.readouterr().out
    table_rows = rows(printed)
    assert [(row[0], row[1]) for row in table_rows] == [(e.id, e.reference) for e in entries]
    for _, _, transcript, score, digest, replica in table_rows:
        # The replica's answers (the STUB's text), scored and fingerprinted.
        assert transcript.startswith("'stub-") and 0 <= float(score) <= 1
        assert re.fullmatch(r"[0-9a-f]{12}", digest) and replica == "r0"
    assert re.search(r"fingerprint id: grm-\S+", printed)
    assert f"{2 * len(entries)} images in " in printed
    assert "(1 CPU replicas, max_tokens 8)" in printed
    # The commands printed are those of the spec the demo's service ran from.
    lines = printed.splitlines()
    assert f"The demo's model: {model}" in lines
    assert demo_spec(model, 1, Path("work")).command_line(PORT) in lines
    assert score_line({"max_tokens": 8}) in lines
    # What reached the replica: the samples, once a round, with the demo's sampling.
    bodies = [json.dumps(r["body"], sort_keys=True) for r in received([stub])]
    sent = [body for body in bodies if "image_url" in body]
    assert len(sent) == 2 * len(entries) and len(set(sent)) == len(entries)
    assert {json.loads(body)["max_tokens"] for body in sent} == {8}
    # Its temporary work dir is gone with its service.
    assert list(demo_on_stub.iterdir()) == []


def test_a_demo_whose_service_cannot_start_says_why_without_a_traceback(
        demo_on_stub: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GRM_MAX_QUEUE", "-5")  # the child `serve` refuses its settings
    with pytest.raises(typer.Exit) as ended:
        demo.demo_command(replicas=1, max_tokens=8, repeat=1)
    assert ended.value.exit_code == 1
    printed = capsys.readouterr().out
    assert "the demo's service did not start: service exited with" in printed
    assert "max_queue" in printed.lower().replace("-", "_")
