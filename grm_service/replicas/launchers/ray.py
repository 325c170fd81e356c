"""`--launcher ray`: one Ray actor per replica, placed by a placement group (spread or pack).

Each actor runs its replica from the engine profile's recipe on its node
(`ray_actor.ReplicaProcess`); the gateway routes to the replicas' HTTP addresses, and the keeper
treats each actor as a replica source: start places an actor in the replica's bundle, exited asks
the actor (an actor or node that is gone counts as exited), stop asks the actor to stop its engine
and kills it. When a node dies Ray re-places its bundles on the nodes left, where resources allow;
the keeper's next start puts the replica there, with the same seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from grm_service.config import RayPlacement, Settings
from grm_service.engines import Engine, ReplicaSpec
from grm_service.replicas.keeper import ReplicaSource, StartFailed
from grm_service.replicas.launchers.ray_actor import Placed, ReplicaProcess

log = logging.getLogger(__name__)

_STRATEGY = {RayPlacement.SPREAD: "SPREAD", RayPlacement.PACK: "PACK"}
_STOP_SLACK_S = 10.0
_ASK_TIMEOUT_S = 5.0

RemoteReplica = ray.remote(ReplicaProcess)


def _no_failure_signal_handler() -> None:
    """Keep Ray's C++ failure-signal handler out of the gateway's process. As a driver, Ray
    (>= 2.5) installs it for SIGTERM too, and a driver stopped by SIGTERM may then end in SIGABRT
    after its own orderly stop (ray-project/ray#37288): seen here as a gateway that drained,
    stopped its replicas, logged "Finished server process" and exited -6. The switch is the
    module constant `_raylet` reads when the driver's core worker starts (the env var
    RAY_DISABLE_FAILURE_SIGNAL_HANDLER is read once, at import); ray is pinned (pyproject), and
    a release without the constant is logged, not fatal."""
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if constants is None or not hasattr(constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"):
        log.warning("ray %s has no RAY_DISABLE_FAILURE_SIGNAL_HANDLER: a SIGTERM may end the "
                    "gateway in SIGABRT after its stop", ray.__version__)
        return
    constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True


def bundle(engine: Engine) -> dict[str, float]:
    """One replica's resources: a core for its API server, its tensor-parallel GPUs on GPU."""
    gpus = engine.tensor_parallel_size() if engine.name == "vllm" else 0
    return {"CPU": 1.0, **({"GPU": float(gpus)} if gpus else {})}


class RayCluster:
    """Joins the cluster and places the group once, for every replica; closes both."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.group: PlacementGroup | None = None
        self._lock = asyncio.Lock()

    async def ready(self) -> PlacementGroup:
        async with self._lock:
            group = self.group or await self._place()
            self.group = group
            return group

    async def _place(self) -> PlacementGroup:
        s = self.settings
        if not ray.is_initialized():
            _no_failure_signal_handler()
            await asyncio.to_thread(ray.init, address=s.ray_address or None,
                                    include_dashboard=False, log_to_driver=False)
        group: PlacementGroup = placement_group([bundle(self.engine)] * s.replicas,
                                                strategy=_STRATEGY[s.ray_placement])
        try:
            await asyncio.wait_for(group.ready(), s.startup_timeout_s)
        except TimeoutError:
            remove_placement_group(group)
            raise StartFailed(
                f"the Ray cluster cannot place {s.replicas} x {bundle(self.engine)} "
                f"({s.ray_placement}) within {s.startup_timeout_s:.0f} s"
            ) from None
        return group

    def sources(self) -> list[ReplicaSource]:
        return [RaySource(self, i) for i in range(self.settings.replicas)]

    async def close(self) -> None:
        if not ray.is_initialized():
            return
        if self.group is not None:
            remove_placement_group(self.group)
        await asyncio.to_thread(ray.shutdown)
        log.info("Ray replicas stopped")


class RaySource(ReplicaSource):
    """One replica as a Ray actor in bundle `index` of the cluster's group."""

    def __init__(self, cluster: RayCluster, index: int) -> None:
        super().__init__(f"r{index}")
        self.cluster = cluster
        self.index = index
        self._actor: Any = None  # Ray actor handles are untyped
        self._placed: Placed | None = None
        self._tail = ""

    @property
    def pid(self) -> int | None:
        return self._placed.pid if self._placed else None

    async def start(self) -> str:
        group = await self.cluster.ready()
        res = bundle(self.cluster.engine)
        # Port 0: the actor picks a free port on its own node. No GPU ids: Ray assigns them.
        spec = ReplicaSpec(name=self.name, index=self.index, port=0,
                           work_dir=self.cluster.settings.work_dir / self.name)
        self._actor = RemoteReplica.options(
            num_cpus=res["CPU"], num_gpus=res.get("GPU", 0), name=None,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=self.index),
        ).remote(self.cluster.settings, spec)
        try:
            self._placed = await self._actor.start.remote()
        except ray.exceptions.RayError as err:
            raise StartFailed(f"replica {self.name}: Ray could not start it: {err}") from err
        log.info("replica %s placed by Ray: %s pid %d", self.name, self._placed.url,
                 self._placed.pid)
        return self._placed.url

    async def exited(self) -> str | None:
        if self._actor is None:
            return "not running"
        try:
            alive = bool(await asyncio.wait_for(self._actor.alive.remote(), _ASK_TIMEOUT_S))
        except TimeoutError:
            return None  # a node being lost answers late: the health probe decides meanwhile
        except ray.exceptions.RayError as err:  # the actor or its node is gone
            return f"actor lost ({type(err).__name__})"
        if alive:
            return None
        with contextlib.suppress(ray.exceptions.RayError):
            self._tail = str(await self._actor.tail.remote())
        return "engine exited"

    async def tail(self) -> str:
        return self._tail

    async def stop(self, grace_s: float) -> None:
        """Ask the actor to stop its engine (bounded), then kill the actor."""
        actor, self._actor = self._actor, None
        if actor is None or not ray.is_initialized():
            return
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
            await asyncio.wait_for(actor.stop.remote(grace_s), grace_s + _STOP_SLACK_S)
        ray.kill(actor)
