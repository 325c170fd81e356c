"""Replicas as the router and proxy see them: a name, an address, a state and a gate.

The gate lets co-batched requests share a replica while a request that must run alone (the engine
cannot batch it deterministically) waits until the replica is idle, and holds new ones back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

    from grm_service.engine_side.identity import ReplicaIdentity


class ReplicaState(StrEnum):
    """starting -> checking -> ready -> down -> restarting -> starting ...; checking can also end
    in rejected (then restarting); stopped is final."""

    STARTING = "starting"  # launched (or located), not yet answering /health
    CHECKING = "checking"  # healthy; identity and canary being checked
    READY = "ready"
    DOWN = "down"
    RESTARTING = "restarting"  # waiting out the backoff before the next start
    REJECTED = "rejected"  # answers, but is not the model/engine the others are: never routed to
    STOPPED = "stopped"


class Gate:
    """An asyncio reader-writer lock with a bound on shared holders; writers are preferred, so
    exclusive requests never starve behind a stream of shared ones."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting_exclusive = 0
        self._waiting = 0  # tasks inside acquire's wait, either kind

    @property
    def inflight(self) -> int:
        return self._shared + int(self._exclusive)

    def _shared_free(self, capacity: int) -> bool:
        return not (self._exclusive or self._waiting_exclusive) and self._shared < capacity

    def try_acquire(self, exclusive: bool, capacity: int = 1 << 30) -> bool:
        """Take a free slot now, without the condition, when nobody waits ahead. The event loop
        runs one task at a time, so the check and the take cannot interleave with another."""
        if self._waiting:
            return False
        if exclusive:
            if self._exclusive or self._shared:
                return False
            self._exclusive = True
            return True
        if not self._shared_free(capacity):
            return False
        self._shared += 1
        return True

    async def acquire(self, exclusive: bool, capacity: int = 1 << 30) -> None:
        if self.try_acquire(exclusive, capacity):
            return
        async with self._cond:
            self._waiting += 1
            try:
                await self._wait(exclusive, capacity)
            finally:
                self._waiting -= 1

    async def _wait(self, exclusive: bool, capacity: int) -> None:
        if not exclusive:
            await self._cond.wait_for(lambda: self._shared_free(capacity))
            self._shared += 1
            return
        self._waiting_exclusive += 1
        try:
            await self._cond.wait_for(lambda: not self._exclusive and self._shared == 0)
        finally:
            self._waiting_exclusive -= 1
            self._cond.notify_all()
        self._exclusive = True

    async def release(self, exclusive: bool) -> None:
        if exclusive:
            self._exclusive = False
        else:
            self._shared -= 1
        if self._waiting:  # only a waiter needs waking, and waking needs the condition's lock
            async with self._cond:
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def slot(self, exclusive: bool, capacity: int = 1 << 30) -> AsyncIterator[None]:
        await self.acquire(exclusive, capacity)
        try:
            yield
        finally:
            await self.release(exclusive)

    def shared(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.slot(False)

    def exclusive(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.slot(True)


# An attribute read on an Enum class goes through its metaclass's `__getattr__` hook in Python
# 3.11 (~0.7 k instructions): the member the request path compares with, read once.
_READY = ReplicaState.READY


@dataclass
class Replica:
    name: str
    url: str
    state: ReplicaState = ReplicaState.STARTING
    restarts: int = 0
    pid: int | None = None
    detail: str = ""  # why the replica is not ready, when it is known
    serialized: bool = False  # forced to one request at a time (its canary failed co-batching)
    pooling_batched: bool = False  # its pooling canary proved co-batched pooling bitwise equal
    failures: int = 0  # consecutive failed attempts (circuit breaker)
    open_until: float = 0.0  # monotonic time until which the breaker keeps traffic away
    identity: ReplicaIdentity | None = None  # what the replica itself reported at admission
    start_failures: int = 0  # failed starts in a row (the restart backoff); reset once stable
    gate: Gate = field(default_factory=Gate)

    @property
    def ready(self) -> bool:
        return self.state is _READY

    def breaker_open(self, now: float) -> bool:
        return now < self.open_until

    def record(self, ok: bool, now: float, threshold: int, cooldown_s: float) -> bool:
        """Count an attempt's outcome; True when this failure opens the breaker."""
        if ok:
            self.failures = 0
            return False
        self.failures += 1
        if self.failures >= threshold and not self.breaker_open(now):
            self.open_until = now + cooldown_s
            return True
        return False


# Run before a replica is routed to: returns why it must not be, or None. May mark it serialized.
AdmissionCheck = Callable[[Replica, "httpx.AsyncClient"], Awaitable[str | None]]


@dataclass
class ReplicaPool:
    replicas: list[Replica] = field(default_factory=list)

    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.ready]

    def by_name(self, name: str) -> Replica | None:
        return next((r for r in self.replicas if r.name == name), None)
