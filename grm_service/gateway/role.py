"""A serving process's place among the gateway's workers (`serve --workers N`), as the manager
tells it."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerRole:
    """What one worker process is told by the manager."""

    index: int
    count: int
    run_dir: Path
    listen_fd: int
    followers_fd: int | None = None  # worker 0: EOF once every follower has exited

    @property
    def keeper(self) -> bool:
        return self.index == 0

    @property
    def gates_path(self) -> Path:
        return self.run_dir / "gates"

    @property
    def snapshot_path(self) -> Path:
        return self.run_dir / "replicas.json"

    @property
    def metrics_dir(self) -> Path:
        return self.run_dir / "metrics"

    def socket(self) -> socket.socket:
        return socket.socket(fileno=self.listen_fd)

    async def followers_gone(self, timeout_s: float) -> None:
        """Until the manager closes the pipe's write end (or dies), bounded."""
        if self.followers_fd is None:
            return
        fd, loop = self.followers_fd, asyncio.get_running_loop()
        gone: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not os.read(fd, 1) and not gone.done():
                gone.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await asyncio.wait_for(gone, timeout_s)
        except TimeoutError:
            log.warning("followers still running after %.0f s; stopping the replicas anyway",
                        timeout_s)
        finally:
            loop.remove_reader(fd)
