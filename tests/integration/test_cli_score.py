"""`grm-service score` against a real service: an interrupted run plus --resume writes the same
file as an uninterrupted one."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.engines import COMPUTE_REPEATS, RECIPES, attach_args
from tests.support.procs import Proc, running_gateway
from tests.support.scoring import png

pytestmark = pytest.mark.engine

# Enough items that a warm service cannot finish them all between the third line and SIGINT.
N = 48


@pytest.fixture(scope="module")
def service(vlm_backends: list[Proc], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Proc]:
    with running_gateway(tmp_path_factory.mktemp("cli"),
                         *attach_args(vlm_backends, RECIPES["vlm"].served),
                         env=COMPUTE_REPEATS) as gw:
        yield gw


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    rows = []
    for i in range(N):
        (root / f"{i}.png").write_bytes(png(f"LINE {i}", (64 + 8 * i, 32)))
        rows.append(json.dumps({"id": f"e{i:02d}", "image": f"{i}.png", "reference": f"LINE {i}"}))
    (root / "manifest.jsonl").write_text("\n".join(rows) + "\n")
    return root / "manifest.jsonl"


def argv(url: str, manifest: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "grm_service.cli", "score", str(manifest), "--url", url,
            "-o", str(out), "--batch-size", "1", "--concurrency", "1",
            "--sampling", '{"max_tokens": 24}', *extra]


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_interrupted_then_resumed_equals_uninterrupted(
    service: Proc, manifest: Path, tmp_path: Path
) -> None:
    full, part = tmp_path / "full.jsonl", tmp_path / "part.jsonl"
    done = subprocess.run(argv(service.url, manifest, full), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"{N} items" in done.stderr and lines(full) == N

    proc = subprocess.Popen(argv(service.url, manifest, part), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while lines(part) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert 3 <= lines(part) < N and "--resume" in err

    resumed = subprocess.run(argv(service.url, manifest, part, "--resume"), capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    assert part.read_bytes() == full.read_bytes()


def test_csv_output_and_resume_of_a_complete_file(
    service: Proc, manifest: Path, tmp_path: Path
) -> None:
    out = tmp_path / "scores.csv"
    first = subprocess.run(argv(service.url, manifest, out), capture_output=True, text=True,
                           timeout=600)
    assert first.returncode == 0, first.stderr
    before = out.read_bytes()
    assert before.splitlines()[0].startswith(b"id,score,status")
    again = subprocess.run(argv(service.url, manifest, out, "--resume"), capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0 and "0 to score" in again.stderr
    assert out.read_bytes() == before
