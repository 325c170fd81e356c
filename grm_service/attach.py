"""Replicas started elsewhere (`--backend-url`): watch their health, route to the ready ones."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import httpx

from grm_service.config import Settings
from grm_service.metrics import Metrics
from grm_service.replicas import Replica, ReplicaPool, ReplicaState

log = logging.getLogger(__name__)

_HEALTH_EVERY_S = 1.0


class AttachedReplicas:
    """Same verbs as the Supervisor (start, stop, pool), without owning any process."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.pool = ReplicaPool(
            [Replica(name=f"r{i}", url=url) for i, url in enumerate(settings.backend_urls)]
        )
        self._client = httpx.AsyncClient()
        self._monitor: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._check_all()
        self._monitor = asyncio.create_task(self._watch(), name="grm-attach-monitor")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(_HEALTH_EVERY_S)
            await self._check_all()

    async def _check_all(self) -> None:
        await asyncio.gather(*(self._check(r) for r in self.pool.replicas))

    async def _check(self, replica: Replica) -> None:
        try:
            ok = (await self._client.get(replica.url + "/health", timeout=5.0)).status_code == 200
        except httpx.HTTPError:
            ok = False
        state = ReplicaState.READY if ok else ReplicaState.DOWN
        if state is not replica.state:
            log.info("attached replica %s (%s) is %s", replica.name, replica.url, state)
        replica.state = state
        self.metrics.replica_up.labels(replica=replica.name).set(int(ok))

    async def stop(self) -> None:
        if self._monitor:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        for replica in self.pool.replicas:
            replica.state = ReplicaState.STOPPED
        await self._client.aclose()
