"""Group rewards on a GPU engine (issue 48): `grm-service serve --engine vllm`, two replicas.

The CPU test (tests/integration/test_groups_engine.py) answers later permutations from the
ledger; here the score cache is off, so every permutation of every group is judged by the
engine itself, with batch invariance on: groups of 2, 4, 8 and 16, 20 random permutations
each, 1 and 64 requests in flight, then a group judged while one replica is SIGKILLed.

Env: GRM_GPU_MODEL (a text model folder), GRM_GPU_GPUS (default 0), GRM_GPU_MEM (default 0.17),
GRM_GPU_LOG_DIR, GRM_GPU_RESULTS (JSON).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_groups_engine import CONFIGS, VOWELS, body, permuted, rewards
from tests.support.groups import group_items
from tests.support.procs import Proc, start_gateway, wait_ready

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None or not os.environ.get("GRM_GPU_MODEL"),
                       reason="needs a CUDA GPU, vllm and GRM_GPU_MODEL"),
]


def _record(key: str, value: Any) -> None:
    path = os.environ.get("GRM_GPU_RESULTS")
    if path:
        old = json.loads(Path(path).read_text()) if Path(path).exists() else {}
        Path(path).write_text(json.dumps(old | {key: value}, indent=2))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    work = Path(os.environ.get("GRM_GPU_LOG_DIR") or tmp_path_factory.mktemp("gpu-groups"))
    args = ["--model", os.environ["GRM_GPU_MODEL"], "--engine", "vllm", "--dtype", "bfloat16",
            "--max-model-len", "4096", "--served-model-name", "tiny", "--replicas", "2",
            "--gpus", os.environ.get("GRM_GPU_GPUS", "0"), "--",
            "--gpu-memory-utilization", os.environ.get("GRM_GPU_MEM", "0.17"),
            "--max-num-seqs", "256", "--generation-config", "vllm"]
    env = {"GRM_LEDGER_CACHE_SCORE": "false", "GRM_SCORE_ITEMS_PER_SLOT": "1024"}
    started = time.monotonic()
    proc = start_gateway(work, *args, env=env)
    try:
        wait_ready(proc, 900)
        _record("groups_ready_s", round(time.monotonic() - started, 1))
        _record("groups_fingerprint", httpx.get(proc.url + "/v1/fingerprint").json())
        yield proc
    finally:
        proc.stop(timeout=60)


def test_every_permutation_judged_by_the_engine_gives_the_same_rewards(service: Proc) -> None:
    rng = random.Random(48)
    table: list[dict[str, Any]] = []
    for size, scorer, options in CONFIGS:
        for in_flight in (1, 64):
            started = time.monotonic()
            answers = asyncio.run(permuted(service.url, size, scorer, options, in_flight, rng))
            expected = rewards(answers[0])
            same = sum(rewards(a) == expected for a in answers)
            cached = sum(bool(r["fingerprint"] and r["fingerprint"].get("cache"))
                         for a in answers for r in a["results"])
            table.append({"size": size, "scorer": scorer, "in_flight": in_flight,
                          "permutations": len(answers), "identical": same, "cached": cached,
                          "scored": sum(v[0] is not None for v in expected.values()),
                          "seconds": round(time.monotonic() - started, 2)})
    _record("groups_permutations", table)
    assert all(row["identical"] == row["permutations"] and row["cached"] == 0
               for row in table), table
    assert sum(row["scored"] for row in table) > 0, table


def test_a_replica_sigkilled_mid_group_changes_no_reward(service: Proc) -> None:
    items = group_items(16, random.Random(49), group_id="killed")
    clean = httpx.post(service.url + "/v1/score", json=body("pairwise", items, VOWELS),
                       timeout=600)
    assert clean.status_code == 200, clean.text
    victim = next(r for r in httpx.get(service.url + "/ready", timeout=10).json()["replicas"]
                  if r["name"] == "r0")

    async def killed_mid_group() -> httpx.Response:
        async with httpx.AsyncClient(base_url=service.url, timeout=600) as client:
            sent = asyncio.create_task(client.post(
                "/v1/score", json=body("pairwise", items[::-1], VOWELS)))
            deadline = time.monotonic() + 60
            while not any(r["in_flight"] for r in (await client.get("/ready")).json()[
                    "replicas"] if r["name"] == "r0"):
                assert time.monotonic() < deadline and not sent.done(), "nothing in flight"
                await asyncio.sleep(0.002)
            os.killpg(int(victim["pid"]), signal.SIGKILL)
            return await sent

    chaos = asyncio.run(killed_mid_group())
    assert chaos.status_code == 200, chaos.text
    same = rewards(chaos.json()) == rewards(clean.json())
    _record("groups_sigkill_identical", same)
    assert same
