"""A slow deployment, as a new user's first `grm-service score` met it: replicas that serve one
request at a time, each request slower than the queue timeout, batches larger than the slots.
Every item is scored and written; overload is refused at admission, before any work, and the
refusal is logged once, naming the setting. STUB replicas (the gateway is under test)."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grm_service.client import GrmClient
from tests.support.procs import Proc, gateway_on_stubs, received, wait_until
from tests.support.scoring import data_url, png

N = 12
DELAY_S = 0.4  # each engine request; the queue timeout below is shorter
# Every try of a batch pays for each of its items (a cached item would hide a refused batch),
# 4 items per slot: 8 for the two stubs, each serving one request at a time (unverified).
ENV = {"GRM_QUEUE_TIMEOUT_S": "0.5", "GRM_LEDGER_CACHE_SCORE": "false",
       "GRM_SCORE_ITEMS_PER_SLOT": "4"}


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, list[Proc]]]:
    with gateway_on_stubs(tmp_path_factory.mktemp("slow"), env=ENV,
                          stub_args=("--delay", str(DELAY_S), "--record", "64")) as pair:
        yield pair


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("images")
    rows = []
    for i in range(N):
        (root / f"{i}.png").write_bytes(png(f"L{i}"))
        rows.append(json.dumps({"id": f"e{i:02d}", "image": f"{i}.png", "reference": f"L{i}"}))
    (root / "manifest.jsonl").write_text("\n".join(rows) + "\n")
    return root / "manifest.jsonl"


def test_the_first_score_on_a_slow_service_writes_every_item(
    slow: tuple[Proc, list[Proc]], manifest: Path, tmp_path: Path
) -> None:
    gateway, _ = slow
    out = tmp_path / "scores.jsonl"
    # 3 batches of 4 at once would keep 12 items waiting for 2 slots: up to 2.4 s, past the
    # 0.5 s queue timeout.
    done = subprocess.run(
        [sys.executable, "-m", "grm_service.cli", "score", str(manifest), "--url", gateway.url,
         "-o", str(out), "--batch-size", "4", "--concurrency", "3"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"e{i:02d}" for i in range(N)]
    assert all(r["status"] == "ok" for r in rows), rows
    assert "serves 2 request(s) at once" in done.stderr


def test_the_python_client_paces_itself_and_finishes(slow: tuple[Proc, list[Proc]]) -> None:
    gateway, _ = slow
    items = [{"id": str(i), "image": data_url(f"P{i}"), "reference": f"P{i}"} for i in range(N)]
    with GrmClient(gateway.url, batch_size=4, concurrency=3) as client:
        results = client.score(items, "ocr")
    assert [r.id for r in results] == [str(i) for i in range(N)]
    assert all(r.status == "ok" for r in results)
    caps = httpx.get(gateway.url + "/v1/capabilities").json()
    assert (caps["slots"], caps["score_items_admitted"]) == (2, 8)


def test_overload_is_refused_at_admission_before_any_work_and_logged_once(
    slow: tuple[Proc, list[Proc]],
) -> None:
    gateway, stubs = slow

    def batch(tag: str, n: int) -> httpx.Response:
        items = [{"id": str(i), "image": data_url(f"{tag}{i}"), "reference": "x"}
                 for i in range(n)]
        return httpx.post(gateway.url + "/v1/score", json={"scorer": "ocr", "items": items},
                          timeout=60)

    received(stubs, clear=True)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # Nothing else owed: admitted whatever its size. 24 items on 2 slots keep it running
        # about 5 s, so the three batches below meet it owed even on a loaded machine.
        first = pool.submit(batch, "A", 24)
        wait_until(lambda: bool(received(stubs)), "the first batch's items running")
        refused = [batch(f"B{k}-", 4) for k in range(3)]
        assert first.result().status_code == 200
    for answer in refused:
        assert answer.status_code == 429, answer.text
        assert int(answer.headers["retry-after"]) >= 1
        assert "GRM_SCORE_ITEMS_PER_SLOT=4" in answer.json()["error"]["message"]
    assert len(received(stubs)) == 24, "an item of a refused batch reached a replica"
    metrics = httpx.get(gateway.url + "/metrics").text
    assert 'grm_rejected_total{reason="score_backlog"} 3.0' in metrics
    logged = [line for line in gateway.tail(400).splitlines() if "(score_backlog)" in line]
    assert len(logged) == 1 and "GRM_SCORE_ITEMS_PER_SLOT" in logged[0], logged
