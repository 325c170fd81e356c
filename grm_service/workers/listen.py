"""The listening sockets of `serve --workers N`, bound by the manager and handed to the workers.

Why a socket per worker by default: on one shared socket, every worker is woken by a new
connection and the first to run accepts all that are queued (libuv accepts until the queue is
empty). A client that opens its connection pool in a burst (wrk, an HTTP client's pool) can land
most of it on one worker: on 4 workers, 63 of 64 connections were seen on one. Kept-alive, those
connections stay there, and the other workers idle. With SO_REUSEPORT each worker has a socket of
its own on the port, and the kernel hashes each new connection's addresses onto one of them: the
spread is the hash's, the same for a burst as for a trickle.

The manager keeps every socket open and listening, so a connection that arrives while a worker
is restarting waits in that worker's queue and is served once it is back; on a shared socket the
other workers take it at once (`worker_sockets=shared`).
"""

from __future__ import annotations

import socket

from grm_service.config import Settings, WorkerSockets

# uvicorn's default; a worker's server listens again with its own backlog, the same.
_BACKLOG = 2048


def listening_sockets(settings: Settings) -> list[socket.socket]:
    """One socket per worker (`per-worker`), or one for all (`shared`); worker i gets socket
    i % len(...). None of them inheritable: each is handed over explicitly (pass_fds)."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    if settings.worker_sockets is WorkerSockets.SHARED or settings.workers == 1:
        sockets = [_bound(family, settings.host, settings.port, reuse_port=False)]
    else:
        if settings.port:
            _refuse_if_taken(family, settings.host, settings.port)
        first = _bound(family, settings.host, settings.port, reuse_port=True)
        port = first.getsockname()[1]  # the port the kernel chose, where settings.port is 0
        sockets = [first, *(_bound(family, settings.host, port, reuse_port=True)
                            for _ in range(settings.workers - 1))]
    for sock in sockets:
        sock.set_inheritable(False)
    return sockets


def _bound(family: socket.AddressFamily, host: str, port: int, reuse_port: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if reuse_port:
            # In the kernel's group from now on: a worker that starts late does not leave the
            # early connections to the others.
            sock.listen(_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _refuse_if_taken(family: socket.AddressFamily, host: str, port: int) -> None:
    """EADDRINUSE where another process listens on the port: SO_REUSEPORT alone would join its
    group (same user) and split the traffic with it, silently."""
    probe = _bound(family, host, port, reuse_port=False)
    probe.close()
