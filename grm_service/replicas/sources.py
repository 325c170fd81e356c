"""Replica sources for the keeper: a local child process, or an address started elsewhere."""

from __future__ import annotations

import asyncio
import os

from grm_service.config import Settings
from grm_service.engines import Engine, ReplicaSpec
from grm_service.replicas.child import ReapedProcess, free_port
from grm_service.replicas.keeper import ReplicaSource


class LocalSource(ReplicaSource):
    """A replica as a child process group of the gateway, on a fresh port at each start."""

    def __init__(self, engine: Engine, index: int) -> None:
        super().__init__(f"r{index}")
        self.engine = engine
        self.index = index
        self._proc: ReapedProcess | None = None
        self._last: ReapedProcess | None = None  # stopped, kept for its log tail

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def devices(self) -> tuple[int, ...]:
        return self.engine.gpu_set(self.index)

    def spec(self) -> ReplicaSpec:
        settings = self.engine.settings
        return ReplicaSpec(name=self.name, index=self.index, port=free_port(),
                           work_dir=settings.work_dir / self.name,
                           gpus=self.engine.gpu_set(self.index))

    async def start(self) -> str:
        spec = self.spec()
        spec.sweep_stale_tmp()  # what a killed gateway on this work dir left
        command = self.engine.command(spec, dict(os.environ))
        self._proc = ReapedProcess(command, spec.work_dir / "replica.log", scratch=spec.tmp_dir)
        await asyncio.to_thread(self._proc.start)
        return f"http://127.0.0.1:{spec.port}"

    async def exited(self) -> str | None:
        code = self._proc.returncode() if self._proc else None
        return None if code is None else f"exited ({code})"

    async def stop(self, grace_s: float) -> None:
        if self._proc is not None:
            self._last, self._proc = self._proc, None
            await asyncio.to_thread(self._last.stop, grace_s)

    async def tail(self) -> str:
        proc = self._proc or self._last
        return f"(log {proc.log_path})\n{proc.tail()}" if proc else ""


class AttachedSource(ReplicaSource):
    """A replica someone else runs (`grm-service replica`, a plain vLLM server): only located."""

    owns_process = False

    def __init__(self, index: int, url: str) -> None:
        super().__init__(f"r{index}")
        self.url = url

    async def start(self) -> str:
        return self.url


def local_sources(engine: Engine) -> list[ReplicaSource]:
    return [LocalSource(engine, i) for i in range(engine.settings.replicas)]


def attached_sources(settings: Settings) -> list[ReplicaSource]:
    return [AttachedSource(i, url) for i, url in enumerate(settings.replica_urls)]
