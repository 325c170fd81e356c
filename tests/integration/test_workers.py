"""`serve --workers 2` on real HTTP, in front of STUB replicas (the gateway itself is under test):
two serving processes on one port and the keeper's process, one replica set, limits and metrics
across both, drain, restart of a dead or hung worker that leaves the replicas as they are."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import time
from collections.abc import Callable, Iterator
from datetime import datetime
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


def _gateway(tmp_path: Path, stubs: list[Proc], *args: str, **env: str) -> Proc:
    urls = [a for s in stubs for a in ("--replica-url", s.url)]
    # Every request must run alone on its replica, from whichever worker it comes.
    # TMPDIR: the run dir a SIGKILLed manager leaves behind stays in the test's folder.
    gw = start_gateway(tmp_path, *urls, "--served-model-name", "rm", "--workers", "2",
                       *(args or ("--serialize", "on")), env={"TMPDIR": str(tmp_path), **env})
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


def _both_workers(gw: Proc) -> dict[int, int]:
    """`_workers` once both have published their pid."""
    wait_until(lambda: len(_workers(gw)) == 2, "both workers in /metrics")
    return _workers(gw)


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
        keeper = _keeper(gw, workers)
        for index in (0, 1):  # worker 0 as any other: it keeps no replica
            workers = _kill_and_replace(gw, workers, index)
            again = asyncio.run(_chats(gw.url, list(range(8))))
            assert [r.headers["x-grm-replica"] for r in again] == [
                next(iter(owners[i])) for i in range(8)]
        assert _keeper(gw, workers) == keeper, "the keeper's process lived through it all"
        log = gw.log.read_text()
        assert log.count("service identity from") == 1, "admitted once, never again"
        assert all(r["restarts"] == 0 for r in httpx.get(gw.url + "/ready").json()["replicas"])
        assert views == {httpx.get(gw.url + "/v1/fingerprint").text}
    finally:
        gw.stop()


def _keeper(gw: Proc, workers: dict[int, int]) -> int:
    (keeper,) = set(descendants(gw.popen.pid)) - set(workers.values())
    return keeper


def _kill_and_replace(gw: Proc, workers: dict[int, int], index: int) -> dict[int, int]:
    """SIGKILL worker `index`; every request sent meanwhile is answered (the replicas stay
    ready; those the kernel gives the dead worker's socket wait for its successor); back to two
    workers, the new one serving; the new worker pids."""
    dead = workers[index]
    os.kill(dead, signal.SIGKILL)
    during = asyncio.run(_chats(gw.url, list(range(16))))
    assert [r.status_code for r in during] == [200] * 16, [r.text for r in during]
    wait_until(lambda: _restarted(gw, dead), f"worker {index} restarted")
    assert f"worker {index} (pid {dead}) exited (-9)" in gw.log.read_text()
    wait_until(lambda: dead not in _workers(gw).values() and len(_workers(gw)) == 2,
               f"worker {index}'s successor counted")
    return _workers(gw)


def _restarted(gw: Proc, dead: int) -> bool:
    alive = descendants(gw.popen.pid)
    return len(alive) == 3 and dead not in alive and _ready(gw)


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
    assert len(workers) == 3, "two workers and the keeper"

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
    assert log.count("stopping the replicas") == 1  # the keeper's process, last
    assert not list(tmp_path.glob("grm-workers-*"))  # the run dir is removed


def test_workers_end_with_a_killed_manager(tmp_path: Path, stubs: list[Proc]) -> None:
    gw = _gateway(tmp_path, stubs)
    workers = descendants(gw.popen.pid)
    assert len(workers) == 3, "two workers and the keeper"
    os.kill(gw.popen.pid, signal.SIGKILL)  # no chance to stop them: the parent-death signal
    gw.popen.wait(DEADLINE_S)
    wait_until(lambda: pids_alive(workers) == [], f"workers {workers} ended")
    # Only the manager removes the run dir (a SIGKILL leaves it in TMPDIR): proof that the
    # check of its removal after SIGTERM looks in the right place.
    (left,) = tmp_path.glob("grm-workers-*")
    # The next manager on this temp dir sweeps it, its own kept.
    again = _gateway(tmp_path, stubs)
    try:
        (own,) = tmp_path.glob("grm-workers-*")
        assert own != left and own.name.startswith(f"grm-workers-{again.popen.pid}-")
    finally:
        again.stop()


def test_a_hung_worker_is_replaced(tmp_path: Path, stubs: list[Proc]) -> None:
    """SIGSTOP: the process lives but its loop answers nothing; the manager's ping finds out."""
    gw = _gateway(tmp_path, stubs, GRM_WORKER_PING_INTERVAL_S="0.2",
                  GRM_WORKER_PING_TIMEOUT_S="1")
    try:
        workers = _both_workers(gw)
        keeper = _keeper(gw, workers)
        hung = workers[1]
        # A worker that has not answered its first ping is still starting and gets the manager's
        # start-up allowance (60 s): stop one whose pongs the manager has seen, the case under
        # test (stopped between "serving" and its first pong, it took the allowance: 93 s).
        wait_until(lambda: f"worker 1 (pid {hung}) answers its pings" in gw.log.read_text(),
                   "worker 1 answering pings")
        os.kill(hung, signal.SIGSTOP)
        stopped = time.monotonic()
        # Within 1 s unanswered, a ping every 0.2 s, the manager's 0.1 s tick.
        wait_until(lambda: "has not answered a ping" in gw.log.read_text(), "the hung worker "
                   "killed", timeout=30)
        assert time.monotonic() - stopped >= 1.0, "killed before its ping timed out"
        wait_until(lambda: pids_alive([hung]) == [], "the hung worker gone")
        wait_until(lambda: _restarted(gw, hung), "worker 1 replaced")
        wait_until(lambda: hung not in _workers(gw).values() and len(_workers(gw)) == 2,
                   "worker 1's successor counted")
        answers = asyncio.run(_chats(gw.url, list(range(8))))
        assert {r.status_code for r in answers} == {200}
        assert _keeper(gw, _workers(gw)) == keeper
        # The busy worker that was never stopped was never taken for a hung one.
        assert gw.log.read_text().count("has not answered a ping") == 1
    finally:
        gw.stop()


def _owner(conn: socket.socket, pids: list[int]) -> int | None:
    """The pid among `pids` that accepted this client connection (read from /proc)."""
    port = conn.getsockname()[1]
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].split(":")[1], 16) == port:  # its peer is our end
            inode = fields[9]
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                if os.readlink(fd) == f"socket:[{inode}]":
                    return pid
    return None


def _accepted_by(conn: socket.socket, pids: list[int]) -> int:
    deadline = time.monotonic() + DEADLINE_S
    while (owner := _owner(conn, pids)) is None:
        assert time.monotonic() < deadline, "the connection was never accepted"
        time.sleep(0.01)
    return owner


def _connection_to(gw: Proc, pid: int, others: list[int]) -> socket.socket:
    """A client connection that worker `pid` accepted (the kernel picks: try until it does)."""
    port = int(gw.url.rsplit(":", 1)[1])
    for _ in range(200):
        conn = socket.create_connection(("127.0.0.1", port))
        if _accepted_by(conn, [pid, *others]) == pid:
            return conn
        conn.close()
    raise AssertionError(f"no connection reached pid {pid}")


def _send_chat(conn: socket.socket, seed: int) -> None:
    body = json.dumps({"messages": MSGS, "seed": seed}).encode()
    conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: "
                 b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


def _seeds(stub: Proc) -> list[int]:
    return [r["body"]["seed"] for r in httpx.get(stub.url + "/stub/received").json()]


def _started_at(log: str, worker: int) -> list[float]:
    """When each process of `worker` was started, by the gateway's log."""
    stamp = re.compile(rf"^(\S+ \S+) INFO \S+: worker {worker} started \(pid \d+\)$", re.M)
    return [datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f").timestamp() for t in stamp.findall(log)]


def test_a_dead_workers_shared_counts_are_released_at_once(tmp_path: Path) -> None:
    """One slot on the replica (GRM_MAX_INFLIGHT_PER_REPLICA=1), taken by a request in worker
    A; worker B's request waits for it. A is SIGKILLed: B's request goes through before A's
    successor has even started serving (before, only that successor freed A's counts)."""
    stub = start_stub(tmp_path, "--record", "100")
    gw = _gateway(tmp_path, [stub], "--serialize", "off", GRM_MAX_INFLIGHT_PER_REPLICA="1",
                  GRM_AUDIT_FRACTION="0")
    opened = contextlib.ExitStack()
    try:
        workers = _both_workers(gw)
        httpx.delete(stub.url + "/stub/received")
        httpx.post(stub.url + "/stub/hold").raise_for_status()
        a, b = workers[0], workers[1]
        first = opened.enter_context(_connection_to(gw, a, [b]))
        _send_chat(first, 1)
        wait_until(lambda: httpx.get(stub.url + "/stub/overlap").json()["in_flight"] == 1,
                   "A's request held at the replica")
        second = opened.enter_context(_connection_to(gw, b, [a]))
        _send_chat(second, 2)
        os.kill(a, signal.SIGKILL)
        wait_until(lambda: 2 in _seeds(stub), "B's request at the replica")
        # Ordered by the clock, not by when this test looks: on a loaded machine the look can
        # come after the successor's start (1 s after the death) though B's request did not.
        (arrived,) = [r["at"] for r in httpx.get(stub.url + "/stub/received?at=1").json()
                      if r["body"]["seed"] == 2]
        started, *successor = _started_at(gw.log.read_text(), 0)
        assert started < arrived
        # a log's time is cut to the millisecond; no process releases anything in one
        assert not successor or arrived < successor[0] + 0.001, (
            f"B's request reached the replica {arrived - successor[0]:.3f} s after A's "
            "successor started")
        httpx.post(stub.url + "/stub/release").raise_for_status()
        second.settimeout(DEADLINE_S)
        assert second.recv(65536).startswith(b"HTTP/1.1 200 ")
    finally:
        opened.close()
        httpx.post(stub.url + "/stub/release")
        gw.stop()
        stub.stop()
