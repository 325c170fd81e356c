"""`grm-service score` on a folder of images with a prompt manifest, or prompts beside the images,
through a gateway on recording STUB replicas (the gateway and the command are under test, not an
engine): every image reaches the `reward_head` scorer with its own prompt, and the progress bar
runs to the end."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.engines import COMPUTE_REPEATS
from tests.support.procs import Proc, gateway_on_stubs, received
from tests.support.scoring import png

PROMPTS = {"a.png": "a red fox", "b.png": "a blue whale", "c.png": "a green tree"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, list[Proc]]]:
    with gateway_on_stubs(tmp_path_factory.mktemp("cli-prompts"), env=COMPUTE_REPEATS,
                          stub_args=("--record", "1000")) as pair:
        yield pair


def folder(root: Path, sidecars: bool) -> Path:
    images = root / "images"
    images.mkdir(parents=True)
    for name, prompt in PROMPTS.items():
        (images / name).write_bytes(png(name[0].upper()))
        if sidecars:
            (images / name).with_suffix(".txt").write_text(prompt + "\n")
    return images


def score(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "grm_service.cli", "score", *args, "--url", url,
                           "--scorer", "reward_head", "--batch-size", "2"],
                          capture_output=True, text=True, timeout=120, check=False)


def sent_prompts(stubs: list[Proc]) -> set[str]:
    bodies = [r["body"] for r in received(stubs) if r["path"] == "/classify"]
    received(stubs, clear=True)
    return {b["messages"][0]["content"][1]["text"] for b in bodies}  # type: ignore[index]


def test_prompt_manifest_and_sidecars_score_each_image_with_its_prompt(
    served: tuple[Proc, list[Proc]], tmp_path: Path
) -> None:
    gateway, stubs = served
    received(stubs, clear=True)
    images = folder(tmp_path / "manifest", sidecars=False)
    manifest = tmp_path / "prompts.jsonl"
    manifest.write_text("".join(json.dumps({"image": k, "prompt": v}) + "\n"
                                for k, v in PROMPTS.items()))
    out = tmp_path / "manifest.jsonl"
    done = score(gateway.url, str(images), "--prompts", str(manifest), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "3/3" in done.stderr, "the progress bar ran to the end"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["status"], r["score"]) for r in rows] == [
        (k, "ok", 0.25) for k in PROMPTS]  # the STUB's /classify: (0.25, 0.75) raw
    assert sent_prompts(stubs) == set(PROMPTS.values())

    beside = folder(tmp_path / "sidecars", sidecars=True)
    again = score(gateway.url, str(beside), "-o", str(tmp_path / "sidecars.jsonl"))
    assert again.returncode == 0, again.stderr
    assert sent_prompts(stubs) == set(PROMPTS.values()), "name.txt is the prompt here"


def test_an_image_without_a_prompt_is_refused_before_scoring(
    served: tuple[Proc, list[Proc]], tmp_path: Path
) -> None:
    gateway, stubs = served
    images = folder(tmp_path, sidecars=False)
    manifest = tmp_path / "prompts.csv"
    manifest.write_text("image,prompt\na.png,a red fox\n")
    done = score(gateway.url, str(images), "--prompts", str(manifest), "-o",
                 str(tmp_path / "out.jsonl"))
    assert done.returncode == 2 and "have no prompt" in done.stderr
    assert not (tmp_path / "out.jsonl").exists()
    assert not received(stubs)
