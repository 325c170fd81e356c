"""The workers' listening sockets on real ports: a socket per worker on one port, connections
spread over them by the kernel and queued while no worker accepts, a taken port refused, and
the shared mode's one socket."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from grm_service.config import Settings, WorkerSockets
from grm_service.workers.listen import listening_sockets


def _settings(workers: int, mode: WorkerSockets, port: int = 0) -> Settings:
    return Settings(replica_urls=["http://127.0.0.1:9"], host="127.0.0.1", port=port,
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


def test_a_socket_per_worker_on_one_port_and_a_burst_spread_over_them(
        opened: list[socket.socket]) -> None:
    sockets = listening_sockets(_settings(4, WorkerSockets.PER_WORKER))
    opened += sockets
    assert len(sockets) == 4
    port = sockets[0].getsockname()[1]
    assert {s.getsockname()[1] for s in sockets} == {port}
    assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) for s in sockets)
    assert not any(s.get_inheritable() for s in sockets)  # handed over by pass_fds only
    # A burst of connections, as a client's pool opens them, before any worker accepts: each
    # socket listens from the start, so none is refused, and the kernel spreads them (one
    # shared socket leaves them to whichever worker wakes first).
    opened += [socket.create_connection(("127.0.0.1", port)) for _ in range(64)]
    counts = _accepted(sockets)
    assert sum(counts) == 64
    assert min(counts) > 0, counts  # one of 4 gets none with probability ~4e-8


def test_a_port_another_server_listens_on_is_refused(opened: list[socket.socket]) -> None:
    other = socket.socket()
    opened.append(other)
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # even one that would share
    other.bind(("127.0.0.1", 0))
    other.listen(8)
    port = other.getsockname()[1]
    for mode in WorkerSockets:
        with pytest.raises(OSError):
            listening_sockets(_settings(2, mode, port))


def test_shared_mode_and_one_worker_bind_one_plain_socket(opened: list[socket.socket]) -> None:
    for settings in (_settings(4, WorkerSockets.SHARED), _settings(1, WorkerSockets.PER_WORKER)):
        sockets = listening_sockets(settings)
        opened += sockets
        assert len(sockets) == 1
        assert not sockets[0].getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
