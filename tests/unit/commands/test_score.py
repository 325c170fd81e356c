from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from grm_service import cli
from grm_service.commands.score import serve_spec
from grm_service.config import EngineName
from grm_service.engines import resolve_engine


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
    from collections.abc import Iterator

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
