"""The listening sockets of `serve --workers N`: bound by the manager, one handed to each worker
at each of its starts.

Why a socket per worker by default: on one shared socket, every worker is woken by a new
connection and the first to run accepts all that are queued (libuv accepts until the queue is
empty). A client that opens its connection pool in a burst (wrk, an HTTP client's pool) can land
most of it on one worker: on 4 workers, 63 of 64 connections were seen on one. Kept alive, those
connections stay there, and the other workers idle. With SO_REUSEPORT each worker has a socket of
its own on the port, and the kernel hashes each new connection's addresses onto one of the
listening ones: the spread is the hash's, the same for a burst as for a trickle.

Each worker's socket is its own: the manager closes its copy once the worker has it, and binds a
fresh one for a restart. A worker's socket joins the kernel's group when its server listens,
and leaves it when the worker dies, so no new connection waits on a dead worker; those the
kernel had queued for it and the worker had not yet taken are reset with it (on a shared socket
the other workers would take them). The manager holds one more socket, bound and never
listening, for the whole run: the port every start binds (port 0: the kernel's choice).
"""

from __future__ import annotations

import socket

from grm_service.config import Settings, WorkerSockets


class Listeners:
    """`for_start()` is the socket to hand to a worker being started; `handed(sock)` once the
    worker has its copy."""

    def __init__(self, settings: Settings) -> None:
        self._family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        self._host = settings.host
        self._own = (settings.worker_sockets is WorkerSockets.PER_WORKER
                     and settings.workers > 1)
        if self._own and settings.port:
            # SO_REUSEPORT alone would join another server's group on the port (same user)
            # and split its traffic, silently: refuse a taken port as a plain bind does.
            _bound(self._family, self._host, settings.port, reuse_port=False).close()
        self._held = _bound(self._family, self._host, settings.port, reuse_port=self._own)
        self.port: int = self._held.getsockname()[1]  # the kernel's choice for port 0

    def for_start(self) -> socket.socket:
        if not self._own:
            return self._held
        return _bound(self._family, self._host, self.port, reuse_port=True)

    def handed(self, sock: socket.socket) -> None:
        if sock is not self._held:
            sock.close()  # the worker's own now: it leaves the group when the worker ends

    def close(self) -> None:
        self._held.close()


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
    sock.set_inheritable(False)  # handed over explicitly (pass_fds), to workers only
    return sock
