"""`grm-service score`: its options, its `--serve` start, and whole runs against a gateway on a
recording STUB replica (the command and the gateway under test, no engine): what each outcome
writes, says and exits with."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner, Result

from grm_service import cli
from grm_service.commands import score as score_module
from grm_service.commands.score import serve_spec
from grm_service.config import EngineName
from grm_service.engines import resolve_engine
from grm_service.mime import encode_bytes
from tests.support.engines import COMPUTE_REPEATS
from tests.support.procs import Proc, descendants, gateway_on_stubs, received, wait_until
from tests.support.scoring import png


async def test_ctrl_c_interrupts_a_running_task_group() -> None:
    import asyncio
    import os
    import signal

    from grm_service.commands.score import _until_interrupted

    finished = []

    async def work() -> None:
        async with asyncio.TaskGroup() as group:
            for _ in range(3):
                group.create_task(asyncio.sleep(10))
        finished.append(True)

    asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        await _until_interrupted(work())
    assert finished == []


def _parsed(command: str, args: list[str]) -> dict[str, Any]:
    """The options the real `grm-service COMMAND` parses from `args` (nothing is run)."""
    group = typer.main.get_command(cli.app)
    assert isinstance(group, typer.core.TyperGroup)
    with group.commands[command].make_context(command, args) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize(("given", "child_engine"), [
    ([], None), (["--engine", "vllm"], EngineName.VLLM), (["--engine", "vllm-cpu"],
                                                          EngineName.VLLM_CPU)])
def test_score_serve_picks_the_engine_as_serve_does(
        tmp_path: Path, given: list[str], child_engine: EngineName | None) -> None:
    """Without --engine, the service `score --serve` starts gets none either: its `serve`
    resolves `auto` (vllm where a CUDA GPU is visible, else vllm-cpu) as a bare `serve` does."""
    params = _parsed("score", ["imgs/", "-o", "out.jsonl", "--serve", "--model", "/m", *given])
    spec = serve_spec(tmp_path, "/m", params["replicas"], params["engine"], params["dtype"],
                      params["max_model_len"], ["--enforce-eager"])
    argv = spec.argv(8123)
    assert argv[1:4] == ["-m", "grm_service.cli", "serve"]
    served = _parsed("serve", argv[4:])
    assert served["engine"] == child_engine
    bare = _parsed("serve", ["--model", "/m"])
    settings = cli.build_settings(model="/m", engine=served["engine"])
    if not given:
        assert settings.engine == cli.build_settings(model="/m", engine=bare["engine"]).engine
        assert resolve_engine(settings.engine) == resolve_engine(EngineName.AUTO)
    assert argv[-2:] == ["--", "--enforce-eager"]


def test_score_serve_shows_each_step_of_the_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import contextlib

    from grm_service.commands.local_service import Report
    from grm_service.commands.score import served

    @contextlib.contextmanager
    def start(spec: object, report: Report) -> Iterator[str]:
        for state in ("starting the gateway", "starting the gateway",
                      "replicas ready: 0/2 (r0 starting, r1 starting)",
                      "replicas ready: 1/2 (r0 ready, r1 checking)"):
            report(state, 3.0)
        yield "http://127.0.0.1:1"

    spec = serve_spec(tmp_path, "/m", 2, None, "auto", None, None)
    with served(spec, start) as url:
        assert url == "http://127.0.0.1:1"
    err = capsys.readouterr().err
    assert err.count("starting the gateway") == 1
    assert "r0 starting, r1 starting" in err and "r0 ready, r1 checking" in err
    assert "service ready on http://127.0.0.1:1: 2 replica(s)" in err


def test_score_serve_keeps_eager_mode_and_takes_engine_args_by_option(tmp_path: Path) -> None:
    """The inputs argument swallowed every word after `--`: an engine flag was read as an
    input ("no such file"), and the spec lost its default --enforce-eager."""
    params = _parsed("score", ["imgs/", "-o", "out.jsonl", "--serve", "--model", "/m"])
    assert params["engine_args"] is None
    default = serve_spec(tmp_path, "/m", 2, None, "auto", None, None)
    assert default.argv(8123)[-2:] == ["--", "--enforce-eager"]
    given = serve_spec(tmp_path, "/m", 2, None, "auto", None,
                       ["--enforce-eager", "--max-num-seqs", "4"])
    assert given.argv(8123)[-4:] == ["--", "--enforce-eager", "--max-num-seqs", "4"]
    refused = CliRunner().invoke(cli.app, ["score", "imgs/", "-o", str(tmp_path / "o.jsonl"),
                                           "--serve", "--model", str(tmp_path), "--",
                                           "--enforce-eager"])
    assert refused.exit_code == 2
    said = " ".join(refused.output.replace("│", " ").split())  # typer's box, wrapped
    assert "engine args for --serve go in one option" in said and "--engine-args" in said


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    # A path in a message must stay on one line to be found in it: rich wraps at 80 columns.
    monkeypatch.setattr(score_module, "console", Console(stderr=True, width=400))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc]]:
    """A gateway on one recording STUB; its scorers capped at 64 tokens, every item scored
    afresh (a cached answer would never reach the STUB)."""
    env = {**COMPUTE_REPEATS, "GRM_SCORE_MAX_TOKENS": "64"}
    with gateway_on_stubs(tmp_path_factory.mktemp("score"), count=1, env=env,
                          stub_args=("--record", "100")) as (gateway, stubs):
        yield gateway, stubs[0]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli.app, ["score", *args])


def said(result: Result) -> str:
    """The command's output on one line: typer's error box and rich's wrapping undone."""
    return " ".join(result.output.replace("│", " ").split())


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def mixed_manifest(root: Path) -> Path:
    """An item that scores, one the scorer refuses (no reference: the service's error row) and
    one whose image cannot be read here (an error row of the command's own, never sent)."""
    (root / "a.png").write_bytes(png("A"))
    (root / "b.png").write_bytes(png("B"))
    manifest = root / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in (
        {"id": "scored", "image": "a.png", "reference": "A"},
        {"id": "no-reference", "image": "b.png"},
        {"id": "unreadable", "image": "gone.png", "reference": "C"})))
    return manifest


def test_failed_items_are_error_rows_and_exit_1_unless_allowed(
        service: tuple[Proc, Proc], tmp_path: Path) -> None:
    gateway, _ = service
    manifest = mixed_manifest(tmp_path)
    out = tmp_path / "out.jsonl"
    # Batches of one: the unreadable item's batch has nothing to send, and sends nothing.
    failed = invoke(str(manifest), "--url", gateway.url, "-o", str(out), "--batch-size", "1")
    assert failed.exit_code == 1, failed.output
    found = rows(out)
    assert [(r["id"], r["status"]) for r in found] == [
        ("scored", "ok"), ("no-reference", "error"), ("unreadable", "error")]
    assert "needs a reference text" in found[1]["error"]
    assert found[2]["error"] == f"cannot read {tmp_path / 'gone.png'}: No such file or directory"
    assert found[2]["score"] is None and found[2].get("fingerprint") is None
    text = said(failed)
    mean = f"{found[0]['score']:.4f}"
    assert f"3 items, mean score {mean}, 2 errors -> {out}" in text
    assert "2 of 3 items failed" in text and "--allow-errors to exit 0" in text
    # No max_tokens given: the service's cap is named, with how to ask for more.
    assert "the service's scorers stop at 64 tokens here" in text
    # The one STUB serves fewer batches at once than the default --concurrency 4 asks for.
    assert re.search(r"the service serves \d+ request\(s\) at once: \d+ batch\(es\) of 1 in "
                     r"flight, not --concurrency 4", text), text

    before = out.read_bytes()
    resumed = invoke(str(manifest), "--url", gateway.url, "-o", str(out), "--resume")
    assert resumed.exit_code == 1, resumed.output  # its error rows are still there
    assert "resuming: 3 done, 0 to score" in said(resumed)
    assert out.read_bytes() == before

    allowed = tmp_path / "allowed.jsonl"
    passed = invoke(str(manifest), "--url", gateway.url, "-o", str(allowed), "--batch-size", "1",
                    "--allow-errors", "--sampling", '{"max_tokens": 16}', "--concurrency", "1")
    assert passed.exit_code == 0, passed.output
    assert [r["status"] for r in rows(allowed)] == ["ok", "error", "error"]
    text = said(passed)
    assert "2 errors" in text and "items failed" not in text
    assert "stop at 64 tokens" not in text  # the run asked for its own max_tokens
    assert "the service serves" not in text  # one batch at a time: what it asked for


def test_a_batch_the_service_refuses_stops_the_run_and_points_to_resume(
        service: tuple[Proc, Proc], tmp_path: Path) -> None:
    gateway, _ = service
    (tmp_path / "a.png").write_bytes(png("A"))
    out = tmp_path / "out.jsonl"
    refused = invoke(str(tmp_path), "--url", gateway.url, "-o", str(out), "--scorer", "nosuch")
    assert refused.exit_code == 1, refused.output
    text = said(refused)
    assert re.search(r"scoring failed: HTTP 4\d\d: unknown scorer 'nosuch'", text), text
    assert f"0 results are in {out}; rerun with --resume to score the rest" in text
    assert rows(out) == []


def _interrupt_once_sent(stub: Proc, image: bytes) -> None:
    """SIGINT to this process once the STUB holds the image's request (the run is then inside
    its scoring loop); the STUB let go if that never comes, so the run cannot hang."""
    sent = encode_bytes(image, "image/png")
    try:
        wait_until(lambda: sent in json.dumps(received([stub])), "the image's request held",
                   timeout=60)
    except AssertionError:
        httpx.post(stub.url + "/stub/release")
        raise
    os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_mid_run_exits_130_and_points_to_resume(
        service: tuple[Proc, Proc], tmp_path: Path) -> None:
    gateway, stub = service
    image = png("HELD")
    (tmp_path / "held.png").write_bytes(image)
    (tmp_path / "held.txt").write_text("HELD\n")  # a reference: the item is sent
    out = tmp_path / "out.jsonl"
    received([stub], clear=True)
    httpx.post(stub.url + "/stub/hold")
    sender = threading.Thread(target=_interrupt_once_sent, args=(stub, image))
    try:
        sender.start()
        result = invoke(str(tmp_path), "--url", gateway.url, "-o", str(out))
    finally:
        httpx.post(stub.url + "/stub/release")
        sender.join()
    assert result.exit_code == 130, result.output
    assert f"interrupted: results so far are in {out}; rerun with --resume" in said(result)
    assert rows(out) == []


def _started_service_argv(found: list[list[str]], done: threading.Event) -> None:
    """The argv of the service `score --serve` starts (its work dir a `grm-score-` temporary
    one), read from /proc while it runs."""
    while not done.is_set() and not found:
        for pid in descendants(os.getpid()):
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
                if "serve" in argv and any("grm-score-" in word for word in argv):
                    found.append(argv)
                    break
        time.sleep(0.05)


@pytest.mark.parametrize("keys", [None, "k1,k2"])
def test_score_serve_scores_through_the_service_it_starts_and_stops_it(
        service: tuple[Proc, Proc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        keys: str | None) -> None:
    """The started service attaches to the STUB (GRM_REPLICA_URLS, which the child `serve`
    reads): the whole --serve path runs, and no engine starts. Where the environment sets
    keys, the service requires one, and the run sends it without --api-key."""
    _, stub = service
    if keys:
        monkeypatch.setenv("GRM_API_KEYS", keys)
    model = tmp_path / "model"
    model.mkdir()  # a folder: the model check before the start passes
    images = tmp_path / "images"
    images.mkdir()
    (images / "a.png").write_bytes(png("A"))
    (images / "a.txt").write_text("A\n")  # beside the image: the ocr scorer's reference
    monkeypatch.setenv("GRM_REPLICA_URLS", stub.url)
    monkeypatch.setenv("GRM_SERVED_MODEL_NAME", "rm")
    out = tmp_path / "out.jsonl"
    argv: list[list[str]] = []
    done = threading.Event()
    looking = threading.Thread(target=_started_service_argv, args=(argv, done))
    looking.start()
    try:
        result = invoke(str(images), "--serve", "--model", str(model), "--replicas", "1",
                        "--engine-args", "--max-num-seqs 4", "-o", str(out))
    finally:
        done.set()
        looking.join()
    assert result.exit_code == 0, result.output
    # The service was started with the run's model, replicas and engine args (after `--`).
    assert argv, "no `serve` child seen while the run went on"
    started_with = argv[0]
    assert started_with[started_with.index("--model") + 1] == str(model)
    assert started_with[started_with.index("--replicas") + 1] == "1"
    assert started_with[started_with.index("--"):] == ["--", "--max-num-seqs", "4"]
    assert [(r["id"], r["status"]) for r in rows(out)] == [("a.png", "ok")]
    started = re.search(r"service ready on (http://127\.0\.0\.1:\d+): 1 replica\(s\) in \d+ s "
                        r"\(log (\S+)/gateway\.log\)", said(result))
    assert started, result.output
    # Stopped on the way out, its temporary work dir removed with it.
    with pytest.raises(httpx.ConnectError):
        httpx.get(started[1] + "/health")
    assert not Path(started[2]).exists()


@pytest.mark.parametrize(("args", "message"), [
    ([], "give exactly one of --url and --serve"),
    (["--url", "http://127.0.0.1:1", "--serve", "--model", "."],
     "give exactly one of --url and --serve"),
    (["--serve"], "--serve needs --model"),
    (["--url", "http://127.0.0.1:1", "--sampling", "{max_tokens: 8}"],
     "Invalid value for --sampling: not JSON: Expecting property name"),
    (["--url", "http://127.0.0.1:1", "--options", "[1]"],
     "Invalid value for --options: must be a JSON object"),
    (["--serve", "--model", ".", "--engine-args", "--max-num-seqs '4"],
     "Invalid value for --engine-args: not shell words (No closing quotation)"),
    (["--serve", "--model", ".", "--engine-args", '["--max-num-seqs", 4]'],
     "Invalid value for --engine-args: a JSON list of engine args must hold strings only"),
    (["--url", "http://127.0.0.1:1", "--format", "xml"],
     "output format must be jsonl or csv, not 'xml'"),
    (["--serve", "--model", "./no-such-model"],
     f"Invalid value for --model: './no-such-model' ({Path.cwd() / 'no-such-model'}) does "
     "not exist"),
])
def test_bad_options_are_refused_before_anything_is_sent_or_started(
        tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "a.png").write_bytes(png("A"))
    out = tmp_path / "out.jsonl"
    refused = invoke(str(tmp_path), "-o", str(out), *args)
    assert refused.exit_code == 2, refused.output
    assert message in said(refused)
    assert not out.exists()


def test_score_serve_whose_service_cannot_start_says_why_without_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child `serve` refuses its settings: the run ends with exit 1 and the child's own
    words, not a Python traceback."""
    model = tmp_path / "model"
    model.mkdir()
    images = tmp_path / "images"
    images.mkdir()
    (images / "a.png").write_bytes(png("A"))
    monkeypatch.setenv("GRM_MAX_QUEUE", "-5")
    result = invoke(str(images), "--serve", "--model", str(model), "-o",
                    str(tmp_path / "out.jsonl"))
    assert result.exit_code == 1, result.output
    assert "--serve: the service did not start: service exited with" in said(result)
    assert "max_queue" in said(result).lower().replace("-", "_")
    assert "Traceback" not in result.output
