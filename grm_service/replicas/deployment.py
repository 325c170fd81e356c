"""The keeper over this deployment's replicas: attached addresses, local children or Ray actors,
admitted by identity, then by the canaries.

Built once per service, in the one process that keeps the replicas: the gateway itself with one
process, the keeper's own process with `serve --workers N` (grm_service/workers/).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from grm_service.config import Launcher, Settings
from grm_service.engines import select_engine
from grm_service.metrics import Metrics
from grm_service.replicas.admission import Admission, OutputCheck
from grm_service.replicas.canary import Canary
from grm_service.replicas.identity import ServiceIdentity
from grm_service.replicas.keeper import Keeper, ReplicaSource
from grm_service.replicas.pool import Replica
from grm_service.replicas.pooling_canary import PoolingCanary
from grm_service.replicas.sources import attached_sources, local_sources


async def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Kept:
    """The keeper, and what closes the cluster its replicas run on (Ray), if any."""

    keeper: Keeper
    close: Callable[[], Awaitable[None]] = _nothing


def output_checks(settings: Settings, metrics: Metrics) -> OutputCheck | None:
    """The canary, then the pooling canary (which proves only what the engine profile claims)."""
    if not settings.canary:
        return None
    checks: list[OutputCheck] = [Canary(settings, metrics), PoolingCanary(settings, metrics)]

    async def run(replica: Replica, client: httpx.AsyncClient) -> str | None:
        for check in checks:
            if problem := await check(replica, client):
                return problem
        return None

    return run


def keeper_for(settings: Settings, metrics: Metrics, identity: ServiceIdentity,
               probes: httpx.AsyncClient) -> Kept:
    """The keeper of this deployment's replica sources; admission settles `identity`."""
    admission = Admission(settings, probes, output_checks(settings, metrics), identity)

    def kept(sources: list[ReplicaSource]) -> Keeper:
        return Keeper(settings, metrics, sources, admission, probes)

    if settings.attach:
        return Kept(kept(attached_sources(settings)))
    engine = select_engine(settings)
    if settings.launcher is Launcher.RAY:
        # Imported here: Ray is an optional extra (`grm-service[ray]`).
        from grm_service.replicas.launchers.ray import RayCluster

        cluster = RayCluster(settings, engine)
        return Kept(kept(cluster.sources()), cluster.close)
    return Kept(kept(local_sources(engine)))
