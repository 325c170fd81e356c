"""A serving process's place among the gateway's workers (`serve --workers N`), as the manager
tells it, and the liveness ping it answers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def gates_path(run_dir: Path) -> Path:
    """The replicas' gates shared by the workers (worker_side/gates.py)."""
    return run_dir / "gates"


def snapshot_path(run_dir: Path) -> Path:
    """The replica set the keeper publishes (worker_side/snapshot.py)."""
    return run_dir / "replicas.json"


def metrics_dir(run_dir: Path) -> Path:
    return run_dir / "metrics"


@dataclass(frozen=True)
class WorkerRole:
    """What one worker process is told by the manager."""

    index: int
    count: int
    run_dir: Path
    listen_fd: int
    ping_fd: int | None = None  # the manager's liveness pings come in here

    @property
    def gates_path(self) -> Path:
        return gates_path(self.run_dir)

    @property
    def snapshot_path(self) -> Path:
        return snapshot_path(self.run_dir)

    @property
    def metrics_dir(self) -> Path:
        return metrics_dir(self.run_dir)

    def socket(self) -> socket.socket:
        return socket.socket(fileno=self.listen_fd)

    def answer_pings(self) -> contextlib.AbstractContextManager[None]:
        return answering_pings(self.ping_fd)


@contextlib.contextmanager
def answering_pings(fd: int | None) -> Iterator[None]:
    """While open, the running event loop echoes each ping byte back: an answer proves the loop
    turns (a worker that is stopped, dead-locked or never yields leaves the ping unanswered)."""
    if fd is None:
        yield
        return
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)

    def answer() -> None:
        with contextlib.suppress(BlockingIOError, ConnectionError):
            if ping := os.read(fd, 64):
                os.write(fd, ping)
                return
            loop.remove_reader(fd)  # EOF: the manager is gone; die_with_parent ends us

    loop.add_reader(fd, answer)
    try:
        yield
    finally:
        loop.remove_reader(fd)
