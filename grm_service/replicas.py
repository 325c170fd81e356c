"""Replicas as the router and proxy see them: a name, an address, a state and a gate.

The gate lets co-batched requests share a replica while a request that must run alone (the engine
cannot batch it deterministically) waits until the replica is idle, and holds new ones back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import StrEnum


class ReplicaState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DOWN = "down"
    STOPPED = "stopped"


class Gate:
    """An asyncio reader-writer lock that prefers writers, so exclusive requests never starve."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting_exclusive = 0

    @property
    def inflight(self) -> int:
        return self._shared + int(self._exclusive)

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._exclusive and not self._waiting_exclusive)
            self._shared += 1
        try:
            yield
        finally:
            async with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            self._waiting_exclusive += 1
            try:
                await self._cond.wait_for(lambda: not self._exclusive and self._shared == 0)
            finally:
                self._waiting_exclusive -= 1
            self._exclusive = True
        try:
            yield
        finally:
            async with self._cond:
                self._exclusive = False
                self._cond.notify_all()

    def slot(self, exclusive: bool) -> contextlib.AbstractAsyncContextManager[None]:
        return self.exclusive() if exclusive else self.shared()


@dataclass
class Replica:
    name: str
    url: str
    state: ReplicaState = ReplicaState.STARTING
    restarts: int = 0
    pid: int | None = None
    gate: Gate = field(default_factory=Gate)

    @property
    def ready(self) -> bool:
        return self.state is ReplicaState.READY


@dataclass
class ReplicaPool:
    replicas: list[Replica] = field(default_factory=list)

    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.ready]

    def by_name(self, name: str) -> Replica | None:
        return next((r for r in self.replicas if r.name == name), None)
