"""The listening sockets of `serve --workers N`, bound by the manager for the whole run and
handed to the workers (worker i, at each of its starts, gets socket i % len(...)).

Why a socket per worker by default: on one shared socket, every worker is woken by a new
connection and the first to run accepts all that are queued (libuv accepts until the queue is
empty). A client that opens its connection pool in a burst (wrk, an HTTP client's pool) can land
most of it on one worker (on 4 workers, one did 97 % of a round's work: benchmarks/RESULTS.md).
Kept alive, those connections stay there, and the other workers idle. With SO_REUSEPORT each
worker has a socket of its own on the port, and the kernel hashes each new connection's
addresses onto one of them: the spread is the hash's, the same for a burst as for a trickle.

The manager keeps every socket open and listening from the start: a connection the kernel gives
a worker that is starting or restarting waits in its socket's queue and is served once the
worker is up (with a shared socket the other workers would take it at once; with a socket bound
afresh per start, a moment when no worker listens would refuse it). So does one given to a hung
worker, until the liveness ping has it killed (`worker_ping_timeout_s`) and its successor is up.
"""

from __future__ import annotations

import socket
import sys

from grm_service.config import Settings, WorkerSockets

# uvicorn's default; a worker's server listens again with its own backlog, the same.
_BACKLOG = 2048


def listening_sockets(settings: Settings) -> list[socket.socket]:
    """One socket per worker (`per-worker`, listening), or one for all (`shared`, left to the
    first worker's server to listen on). None is inheritable: each is handed over explicitly
    (pass_fds)."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    # Linux spreads connections over a port's SO_REUSEPORT sockets; elsewhere (macOS, the BSDs'
    # plain SO_REUSEPORT) one socket may take them all.
    shared = settings.worker_sockets is WorkerSockets.SHARED or sys.platform != "linux"
    if shared or settings.workers == 1:
        return [_bound(family, settings.host, settings.port, reuse_port=False)]
    if settings.port:
        # SO_REUSEPORT alone would join another server's group on the port (same user) and
        # split its traffic, silently: refuse a taken port as a plain bind does.
        _bound(family, settings.host, settings.port, reuse_port=False).close()
    sockets: list[socket.socket] = []
    try:
        port = settings.port
        for _ in range(settings.workers):
            sock = _bound(family, settings.host, port, reuse_port=True)
            sockets.append(sock)
            port = sock.getsockname()[1]  # the kernel's choice, where settings.port is 0
            sock.listen(_BACKLOG)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _bound(family: socket.AddressFamily, host: str, port: int, reuse_port: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock
