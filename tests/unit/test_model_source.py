"""A model no engine could load is refused before any engine starts, in under a second, naming
the value and what to do; what an engine could load passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grm_service import cli
from grm_service.errors import ModelNotFound
from grm_service.model_source import check_model, looks_like_path
from tests.support.procs import free_port


def offline_env(tmp_path: Path) -> dict[str, str]:
    """An engine environment with an empty hub cache and the hub switched off."""
    return {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}


def refused(model: str, env: dict[str, str], cwd: Path, within_s: float = 1.0) -> str:
    """The message; a folder is looked at in well under a second, a hub id may import the hub
    client first (seconds on a loaded machine)."""
    start = time.perf_counter()
    with pytest.raises(ModelNotFound) as caught:
        check_model(model, env, cwd, timeout_s=5)
    assert time.perf_counter() - start < within_s
    assert repr(model) in caught.value.message
    return caught.value.message


@pytest.mark.parametrize("model", ["/no/such/model", "./nope", "../nope", "~/no-such-model-dir",
                                   "models/missing"])
def test_a_missing_folder_says_so(tmp_path: Path, model: str) -> None:
    (tmp_path / "models").mkdir()  # `models/missing`: its first folder exists, so a path
    message = refused(model, offline_env(tmp_path), tmp_path)
    assert "does not exist" in message and "Give the folder" in message


def test_a_file_is_not_a_model_folder(tmp_path: Path) -> None:
    (tmp_path / "weights.safetensors").write_bytes(b"x")
    assert "is a file" in refused("./weights.safetensors", {}, tmp_path)


def test_an_existing_folder_passes(tmp_path: Path) -> None:
    (tmp_path / "rm").mkdir()
    check_model(str(tmp_path / "rm"), {}, tmp_path)
    check_model("rm", {}, tmp_path)  # relative to where the service starts


def test_what_looks_like_a_path() -> None:
    here = Path(__file__).parent
    assert looks_like_path("/m", here) and looks_like_path("~/m", here)
    assert looks_like_path("commands/m", here)  # tests/unit/commands exists
    assert not looks_like_path("Qwen/Qwen2-VL-2B-Instruct", here)


def test_a_hub_id_offline_and_not_cached_says_so(tmp_path: Path) -> None:
    message = refused("Qwen/Qwen2-VL-2B-Instruct", offline_env(tmp_path), tmp_path, 10)
    assert "HF_HUB_OFFLINE" in message and "hf download Qwen/Qwen2-VL-2B-Instruct" in message


def test_a_hub_id_in_the_cache_passes_offline(tmp_path: Path) -> None:
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2-VL-2B-Instruct" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    check_model("Qwen/Qwen2-VL-2B-Instruct", offline_env(tmp_path), tmp_path)


def test_an_unreachable_hub_says_so(tmp_path: Path) -> None:
    """No network here: a hub endpoint where nothing listens stands for it."""
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    message = refused("Qwen/Qwen2-VL-2B-Instruct", env, tmp_path, 10)
    assert "cannot be reached" in message and env["HF_ENDPOINT"] in message


class Hub(BaseHTTPRequestHandler):
    """A hub that knows one model, `org/known`, answering as the hub's API does."""

    def do_GET(self) -> None:
        known = self.path.split("?")[0] == "/api/models/org/known"
        body = json.dumps({"id": "org/known", "sha": "0" * 40} if known
                          else {"error": "Repository not found"}).encode()
        self.send_response(200 if known else 404)
        if not known:
            self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def hub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_a_hub_id_the_hub_knows_passes_and_an_unknown_one_is_named(
        tmp_path: Path, hub: str) -> None:
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_ENDPOINT": hub}
    check_model("org/known", env, tmp_path)
    assert "no such model on " + hub in refused("org/unknown", env, tmp_path, 10)


def test_a_value_that_is_no_hub_id(tmp_path: Path) -> None:
    assert "neither an existing folder nor a hub id" in refused("a/b/c", {}, tmp_path, 10)


@pytest.mark.parametrize(("model", "env"), [
    ("/no/such/model", {}),
    ("Qwen/Qwen2-VL-2B-Instruct", {"HF_HUB_OFFLINE": "1"}),
])
def test_serve_refuses_it_before_any_engine_starts(
        tmp_path: Path, model: str, env: dict[str, str]) -> None:
    """The whole command: a non-zero exit, the reason, no traceback, no replica started (its log
    would be in the work dir). Before, the engine failed a minute into its start."""
    work = tmp_path / "work"
    done = subprocess.run(
        [sys.executable, "-m", "grm_service.cli", "serve", "--model", model, "--engine",
         "vllm-cpu", "--port", str(free_port()), "--work-dir", str(work)],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), **env, "COLUMNS": "300"})
    assert done.returncode == 2, done.stderr
    assert model in done.stderr and "Traceback" not in done.stderr + done.stdout
    assert not work.exists()


def test_score_serve_refuses_it_before_its_service_starts(tmp_path: Path) -> None:
    out = tmp_path / "scores.jsonl"
    done = CliRunner().invoke(cli.app, ["score", str(tmp_path), "-o", str(out), "--serve",
                                        "--model", str(tmp_path / "missing")])
    said = " ".join(done.output.replace("│", " ").split())  # the error box, unwrapped
    assert done.exit_code == 2 and "does not exist" in said, done.output
    assert not out.exists()
