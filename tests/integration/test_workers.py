"""`serve --workers 2` on real HTTP, in front of STUB replicas (the gateway itself is under test):
two processes on one port, one replica set, limits and metrics across both, drain, restart."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.procs import Proc, descendants, pids_alive, start_gateway, start_stub, wait_ready

MSGS = [{"role": "user", "content": "hello"}]
_WORKER = re.compile(r'^grm_worker_requests\{pid="(\d+)",worker="(\d+)"\} (\S+)$', re.M)
_CHAT_OK = re.compile(
    r'^grm_requests_total\{replica="r\d",route="/v1/chat/completions",status="200"\} (\S+)$',
    re.M)


@pytest.fixture
def stubs(tmp_path: Path) -> Iterator[list[Proc]]:
    # 50 ms per request: requests that were let through together overlap at the stub.
    started = [start_stub(tmp_path, "--delay", "0.05") for _ in range(2)]
    yield started
    for stub in started:
        stub.stop()


def _gateway(tmp_path: Path, stubs: list[Proc]) -> Proc:
    urls = [a for s in stubs for a in ("--backend-url", s.url)]
    # Every request must run alone on its replica, from whichever worker it comes.
    # TMPDIR: the run dir a SIGKILLed manager leaves behind stays in the test's folder.
    gw = start_gateway(tmp_path, *urls, "--served-model-name", "rm", "--workers", "2",
                       "--serialize", "on", env={"TMPDIR": str(tmp_path)})
    wait_ready(gw, 60)
    return gw


async def _chats(url: str, seeds: list[int]) -> list[httpx.Response]:
    """One fresh connection per request, all at once: the kernel spreads them over workers."""
    async def one(seed: int) -> httpx.Response:
        async with httpx.AsyncClient() as client:
            return await client.post(url + "/v1/chat/completions",
                                     json={"messages": MSGS, "seed": seed}, timeout=60)

    return list(await asyncio.gather(*(one(seed) for seed in seeds)))


def _workers(gw: Proc) -> dict[int, int]:
    """worker index -> pid, as /metrics reports them (refreshed every second by each worker)."""
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    return {int(index): int(pid) for pid, index, _ in _WORKER.findall(text)}


def test_two_workers_one_replica_set(tmp_path: Path, stubs: list[Proc]) -> None:
    gw = _gateway(tmp_path, stubs)
    try:
        for stub in stubs:  # the canary's co-batched probes overlapped on purpose
            httpx.delete(stub.url + "/stub/overlap")
        answers: list[httpx.Response] = []
        per_worker: dict[int, float] = {}
        for _ in range(5):  # until the kernel has given both workers some connections
            answers += asyncio.run(_chats(gw.url, [i % 8 for i in range(64)]))
            time.sleep(1.5)  # each worker's own count reaches /metrics within a second
            text = httpx.get(gw.url + "/metrics").text
            per_worker = {int(w): float(v) for _, w, v in _WORKER.findall(text)}
            if set(per_worker) == {0, 1} and min(per_worker.values()) > 0:
                break
        assert set(per_worker) == {0, 1} and min(per_worker.values()) > 0, per_worker
        assert sum(float(v) for v in _CHAT_OK.findall(text)) == len(answers)  # summed
        assert {r.status_code for r in answers} == {200}
        owners: dict[int, set[str]] = {}
        for i, r in enumerate(answers):
            owners.setdefault(i % 8, set()).add(r.headers["x-grm-replica"])
        assert all(len(names) == 1 for names in owners.values()), owners
        assert set().union(*owners.values()) == {"r0", "r1"}
        for stub in stubs:  # each request ran alone, across both workers
            assert httpx.get(stub.url + "/stub/overlap").json()["max_in_flight"] == 1

        # Any worker tells the same truth (fresh connections land on either).
        views = {httpx.get(gw.url + "/v1/fingerprint").text for _ in range(8)}
        assert len(views) == 1

        workers = _workers(gw)
        assert sorted(workers.values()) == sorted(descendants(gw.popen.pid))
        os.kill(workers[1], signal.SIGKILL)
        _until(lambda: _restarted(gw, workers[1]), 30, gw)
        assert f"worker 1 (pid {workers[1]}) exited (-9)" in gw.log.read_text()
        again = asyncio.run(_chats(gw.url, list(range(8))))
        assert [r.headers["x-grm-replica"] for r in again] == [
            next(iter(owners[i])) for i in range(8)]
    finally:
        gw.stop()


def _restarted(gw: Proc, dead: int) -> bool:
    alive = descendants(gw.popen.pid)
    return len(alive) == 2 and dead not in alive and _ready(gw)


def _ready(gw: Proc) -> bool:
    try:
        return httpx.get(gw.url + "/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _until(check: object, timeout_s: float, gw: Proc) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s:\n{gw.tail()}")


def test_sigterm_drains_every_worker_and_leaves_nothing(
    tmp_path: Path, stubs: list[Proc]
) -> None:
    gw = _gateway(tmp_path, stubs)
    workers = descendants(gw.popen.pid)
    assert len(workers) == 2

    async def requests_then_sigterm() -> list[httpx.Response]:
        # 24 requests, one at a time per replica: ~0.6 s of work, most of it queued.
        pending = asyncio.ensure_future(_chats(gw.url, list(range(24))))
        await asyncio.sleep(0.3)
        os.kill(gw.popen.pid, signal.SIGTERM)  # the manager alone: it tells the workers
        return await pending

    answers = asyncio.run(requests_then_sigterm())
    assert [r.status_code for r in answers] == [200] * 24  # in flight or queued: all finished
    assert gw.popen.wait(60) == 0
    assert pids_alive(workers) == []
    log = gw.log.read_text()
    assert log.count("draining: new requests get 503") == 2
    assert not list(tmp_path.glob("grm-workers-*"))  # the run dir is removed


def test_workers_end_with_a_killed_manager(tmp_path: Path, stubs: list[Proc]) -> None:
    gw = _gateway(tmp_path, stubs)
    workers = descendants(gw.popen.pid)
    assert len(workers) == 2
    os.kill(gw.popen.pid, signal.SIGKILL)  # no chance to stop them: the parent-death signal
    gw.popen.wait(10)
    deadline = time.monotonic() + 30
    while pids_alive(workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pids_alive(workers) == []
    # Only the manager removes the run dir (a SIGKILL leaves it in TMPDIR): proof that the
    # check of its removal after SIGTERM looks in the right place.
    assert len(list(tmp_path.glob("grm-workers-*"))) == 1
