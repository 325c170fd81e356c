"""The workers' listening sockets on real ports: a socket of its own per worker start, the
connections spread over them by the kernel, a taken port refused, and the shared mode's one
socket."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from grm_service.config import Settings, WorkerSockets
from grm_service.workers.listen import Listeners


def _settings(workers: int, mode: WorkerSockets, port: int = 0) -> Settings:
    return Settings(backend_urls=["http://127.0.0.1:9"], host="127.0.0.1", port=port,
                    workers=workers, worker_sockets=mode)


@pytest.fixture
def opened() -> Iterator[list[socket.socket]]:
    """Sockets a test opens, closed after it."""
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()


def _accepted(listening: list[socket.socket]) -> list[int]:
    """How many connections each listening socket has queued, taking them."""
    counts = []
    for sock in listening:
        sock.setblocking(False)
        count = 0
        while True:
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                break
            conn.close()
            count += 1
        counts.append(count)
    return counts


def test_each_worker_start_gets_a_socket_of_its_own_on_one_port(
        opened: list[socket.socket]) -> None:
    listeners = Listeners(_settings(4, WorkerSockets.PER_WORKER))
    try:
        starts = [listeners.for_start() for _ in range(4)]
        opened += starts
        assert len({s.fileno() for s in starts}) == 4
        assert {s.getsockname()[1] for s in starts} == {listeners.port}
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) for s in starts)
        assert not any(s.get_inheritable() for s in starts)  # handed over by pass_fds only
        for sock in starts:
            sock.listen(128)
        # A burst of connections, as a client's pool opens them: the kernel spreads them over
        # the listening sockets (one shared socket leaves them to whichever worker wakes first).
        clients = [socket.create_connection(("127.0.0.1", listeners.port)) for _ in range(64)]
        opened += clients
        counts = _accepted(starts)
        assert sum(counts) == 64
        assert min(counts) > 0, counts  # each of 4 gets none with probability ~4e-8
    finally:
        listeners.close()


def test_a_handed_socket_is_the_workers_alone_and_a_dead_workers_takes_no_connection(
        opened: list[socket.socket]) -> None:
    listeners = Listeners(_settings(2, WorkerSockets.PER_WORKER))
    try:
        alive, dead = listeners.for_start(), listeners.for_start()
        opened.append(alive)
        alive.listen(128)
        dead.listen(128)
        listeners.handed(dead)  # the manager's copy closed: as when its worker has died
        assert dead.fileno() == -1
        clients = [socket.create_connection(("127.0.0.1", listeners.port)) for _ in range(16)]
        opened += clients
        assert _accepted([alive]) == [16]
    finally:
        listeners.close()


def test_a_port_another_server_listens_on_is_refused(opened: list[socket.socket]) -> None:
    other = socket.socket()
    opened.append(other)
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # even one that would share
    other.bind(("127.0.0.1", 0))
    other.listen(8)
    port = other.getsockname()[1]
    with pytest.raises(OSError):
        Listeners(_settings(2, WorkerSockets.PER_WORKER, port))
    with pytest.raises(OSError):
        Listeners(_settings(2, WorkerSockets.SHARED, port))


def test_shared_mode_and_one_worker_hand_every_start_the_one_socket() -> None:
    for settings in (_settings(4, WorkerSockets.SHARED), _settings(1, WorkerSockets.PER_WORKER)):
        listeners = Listeners(settings)
        try:
            first = listeners.for_start()
            listeners.handed(first)
            assert listeners.for_start() is first and first.fileno() != -1  # kept open
            assert not first.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
        finally:
            listeners.close()
