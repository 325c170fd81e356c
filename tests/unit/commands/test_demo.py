"""`grm-service demo` prints the `serve` and `score` commands that reproduce it by hand: the same
fingerprint id, the same requests. Checked through the CLI's own parser and the identity function
replicas run on themselves; nothing is started."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from grm_service.commands.demo import SAMPLES, SEED, demo_spec, score_line
from grm_service.commands.replica import replica_identity
from grm_service.config import Settings
from tests.support.cli import command, settings_for


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
