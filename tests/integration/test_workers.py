"""`serve --workers 2` on real HTTP, in front of STUB replicas (the gateway itself is under test):
two processes on one port, one replica set, limits and metrics across both, drain, restart."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.procs import (
    DEADLINE_S,
    Proc,
    descendants,
    pids_alive,
    start_gateway,
    start_stub,
    wait_ready,
    wait_until,
)

MSGS = [{"role": "user", "content": "hello"}]
_WORKER = re.compile(r'^grm_worker_requests_total\{worker="(\d+)"\} (\S+)$', re.M)
_STARTED = re.compile(r"worker (\d+) started \(pid (\d+)\)")
_CHAT_OK = re.compile(
    r'^grm_requests_total\{replica="r\d",route="/v1/chat/completions",status="200"\} (\S+)$',
    re.M)
_ANSWERED = re.compile(r'^grm_requests_total\{[^}]*\} (\S+)$', re.M)


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
    wait_ready(gw, DEADLINE_S)
    return gw


async def _chats(url: str, seeds: list[int], sent: set[int] | None = None
                 ) -> list[httpx.Response]:
    """One fresh connection per request, all at once: the kernel spreads them over workers.
    `sent` collects the seeds whose request has been written out whole."""
    async def trace(seed: int, event: str) -> None:
        if sent is not None and event == "http11.send_request_body.complete":
            sent.add(seed)

    async def one(seed: int) -> httpx.Response:
        async with httpx.AsyncClient() as client:
            return await client.post(url + "/v1/chat/completions",
                                     json={"messages": MSGS, "seed": seed}, timeout=DEADLINE_S,
                                     extensions={"trace": lambda e, _: trace(seed, e)})

    return list(await asyncio.gather(*(one(seed) for seed in seeds)))


def _sum(pattern: re.Pattern[str], text: str) -> float:
    return sum(float(v) for v in pattern.findall(text))


def _published(gw: Proc, chats: int) -> tuple[str, dict[int, float]]:
    """/metrics once it counts every chat answered and each worker has published its own count
    since: its gauge is refreshed every second, so wait for the event, not for a second."""
    texts: list[str] = []

    def counted() -> bool:
        texts.append(httpx.get(gw.url + "/metrics", timeout=10).text)
        return _sum(_CHAT_OK, texts[-1]) >= chats

    wait_until(counted, f"{chats} chats in /metrics")
    answered = _sum(_ANSWERED, texts[-1])  # every route, as the workers' own counts are

    def caught_up() -> bool:
        texts.append(httpx.get(gw.url + "/metrics", timeout=10).text)
        return sum(float(v) for _, v in _WORKER.findall(texts[-1])) >= answered

    wait_until(caught_up, f"the workers' own counts reach {answered}")
    return texts[-1], {int(w): float(v) for w, v in _WORKER.findall(texts[-1])}


def _workers(gw: Proc) -> dict[int, int]:
    """worker index -> pid, as the manager logs each start (the latest start of each)."""
    return {int(index): int(pid) for index, pid in _STARTED.findall(gw.log.read_text())}


def test_two_workers_one_replica_set(tmp_path: Path, stubs: list[Proc]) -> None:
    gw = _gateway(tmp_path, stubs)
    try:
        for stub in stubs:  # the canary's co-batched probes overlapped on purpose
            httpx.delete(stub.url + "/stub/overlap")
        answers: list[httpx.Response] = []
        per_worker: dict[int, float] = {}
        for _ in range(5):  # until the kernel has given both workers some connections
            answers += asyncio.run(_chats(gw.url, [i % 8 for i in range(64)]))
            text, per_worker = _published(gw, len(answers))
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
        wait_until(lambda: _restarted(gw, workers[1]), "worker 1 restarted")
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


def test_sigterm_drains_every_worker_and_leaves_nothing(
    tmp_path: Path, stubs: list[Proc]
) -> None:
    gw = _gateway(tmp_path, stubs)
    workers = descendants(gw.popen.pid)
    assert len(workers) == 2

    for stub in stubs:  # each replica keeps its request until released: the rest queue
        httpx.post(stub.url + "/stub/hold").raise_for_status()
    sent: set[int] = set()

    async def until(check: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not check():
            assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {what}"
            await asyncio.sleep(0.05)

    def held() -> list[int]:
        return [httpx.get(s.url + "/stub/overlap").json()["in_flight"] for s in stubs]

    async def requests_then_sigterm() -> list[httpx.Response]:
        # 24 requests, one at a time per replica: two in flight, 22 queued.
        pending = asyncio.ensure_future(_chats(gw.url, list(range(24)), sent))
        await until(lambda: len(sent) == 24 and held() == [1, 1], "24 sent, 2 in flight")
        os.kill(gw.popen.pid, signal.SIGTERM)  # the manager alone: it tells the workers
        await until(lambda: gw.log.read_text().count("draining: new requests get 503") == 2,
                    "both workers draining")
        for stub in stubs:
            httpx.post(stub.url + "/stub/release").raise_for_status()
        return await pending

    answers = asyncio.run(requests_then_sigterm())
    assert [r.status_code for r in answers] == [200] * 24  # in flight or queued: all finished
    assert gw.popen.wait(DEADLINE_S) == 0
    assert pids_alive(workers) == []
    log = gw.log.read_text()
    assert log.count("draining: new requests get 503") == 2
    assert not list(tmp_path.glob("grm-workers-*"))  # the run dir is removed


def test_workers_end_with_a_killed_manager(tmp_path: Path, stubs: list[Proc]) -> None:
    gw = _gateway(tmp_path, stubs)
    workers = descendants(gw.popen.pid)
    assert len(workers) == 2
    os.kill(gw.popen.pid, signal.SIGKILL)  # no chance to stop them: the parent-death signal
    gw.popen.wait(DEADLINE_S)
    wait_until(lambda: pids_alive(workers) == [], f"workers {workers} ended")
    # Only the manager removes the run dir (a SIGKILL leaves it in TMPDIR): proof that the
    # check of its removal after SIGTERM looks in the right place.
    assert len(list(tmp_path.glob("grm-workers-*"))) == 1
