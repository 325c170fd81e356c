"""`--launcher ray`: one Ray actor per replica, placed by a placement group (spread or pack).

Each actor runs its replica with the engine profile's argv and deterministic env, on its node
(`ray_actor.ReplicaProcess`); the gateway routes to the replicas' HTTP addresses. Health is the
actor being alive and its engine answering /health; a replica that fails is restarted by killing
its actor and placing a new one in the same bundle, with the same seed. Shutdown asks each actor
to stop its engine, then kills the actors and removes the placement group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import httpx
import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from grm_service.config import RayPlacement, Settings
from grm_service.engines import Engine, ReplicaSpec
from grm_service.launchers.ray_actor import Placed, ReplicaProcess
from grm_service.metrics import Metrics
from grm_service.replicas import AdmissionCheck, Replica, ReplicaPool, ReplicaState
from grm_service.supervisor import ReplicaStartError

log = logging.getLogger(__name__)

_POLL_S = 0.5
_HEALTH_EVERY_S = 2.0
_HEALTH_FAILURES_DOWN = 3
_STRATEGY = {RayPlacement.SPREAD: "SPREAD", RayPlacement.PACK: "PACK"}

RemoteReplica = ray.remote(ReplicaProcess)


def bundle(engine: Engine) -> dict[str, float]:
    """One replica's resources: a core for its API server, its tensor-parallel GPUs on GPU."""
    gpus = engine.tensor_parallel_size() if engine.name == "vllm" else 0
    return {"CPU": 1.0, **({"GPU": float(gpus)} if gpus else {})}


async def _healthy(client: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await client.get(url + "/health", timeout=5.0)).status_code == 200
    except httpx.HTTPError:
        return False


class RayReplicas:
    """Same verbs as the Supervisor (start, stop, pool), with Ray owning the processes."""

    def __init__(self, settings: Settings, engine: Engine, metrics: Metrics,
                 checks: Sequence[AdmissionCheck] = ()) -> None:
        self.settings = settings
        self.checks = tuple(checks)
        self.engine = engine
        self.metrics = metrics
        self.pool = ReplicaPool()
        self._actors: dict[str, Any] = {}  # Ray actor handles are untyped
        self._group: PlacementGroup | None = None
        self._client = httpx.AsyncClient()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False

    async def start(self) -> None:
        s = self.settings
        await asyncio.to_thread(ray.init, address=s.ray_address or None,
                                include_dashboard=False, log_to_driver=False)
        self._group = placement_group([bundle(self.engine)] * s.replicas,
                                      strategy=_STRATEGY[s.ray_placement])
        try:
            await asyncio.wait_for(self._group.ready(), s.startup_timeout_s)
        except TimeoutError:
            raise ReplicaStartError(
                f"the Ray cluster cannot place {s.replicas} x {bundle(self.engine)} "
                f"({s.ray_placement}) within {s.startup_timeout_s:.0f} s"
            ) from None
        self.pool.replicas.extend(Replica(name=f"r{i}", url="") for i in range(s.replicas))
        started = time.monotonic()
        await asyncio.gather(*(self._launch(r) for r in self.pool.replicas))
        log.info("%d Ray replica(s) ready in %.1f s", s.replicas, time.monotonic() - started)
        self._spawn(self._watch(), "grm-ray-monitor")

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _spec(self, index: int) -> ReplicaSpec:
        # Port 0: the actor picks a free port on its own node. No GPU ids: Ray assigns them.
        name = f"r{index}"
        return ReplicaSpec(name=name, index=index, port=0, work_dir=self.settings.work_dir / name)

    async def _launch(self, replica: Replica) -> None:
        index = int(replica.name[1:])
        res = bundle(self.engine)
        assert self._group is not None, "start() places the group first"
        actor: Any = RemoteReplica.options(
            num_cpus=res["CPU"], num_gpus=res.get("GPU", 0), name=None,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self._group, placement_group_bundle_index=index),
        ).remote(self.settings, self._spec(index))
        self._actors[replica.name] = actor
        replica.state = ReplicaState.STARTING
        placed: Placed = await actor.start.remote()
        replica.url, replica.pid = placed.url, placed.pid
        log.info("replica %s placed by Ray: %s pid %d (engine %s)", replica.name, placed.url,
                 placed.pid, placed.engine_version)
        self._check_version(replica, placed)
        await self._wait_healthy(replica, actor)
        for check in self.checks:  # the canary, before anything is routed here
            if problem := await check(replica, self._client):
                replica.state, replica.detail = ReplicaState.REJECTED, problem
                raise ReplicaStartError(f"replica {replica.name} refused: {problem}")
        replica.state, replica.detail = ReplicaState.READY, ""
        self.metrics.replica_up.labels(replica=replica.name).set(1)
        log.info("replica %s ready at %s", replica.name, replica.url)

    def _check_version(self, replica: Replica, placed: Placed) -> None:
        """A node with another engine build would give other bits under the same identity."""
        mine = self.engine.version()
        if "not-installed" not in (mine, placed.engine_version) and placed.engine_version != mine:
            raise ReplicaStartError(f"replica {replica.name} runs {self.engine.name} "
                                    f"{placed.engine_version}, the gateway {mine}")

    async def _wait_healthy(self, replica: Replica, actor: Any) -> None:
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while time.monotonic() < deadline:
            if not await actor.alive.remote():
                tail = await actor.tail.remote()
                raise ReplicaStartError(f"replica {replica.name} exited; last lines:\n{tail}")
            if await _healthy(self._client, replica.url):
                return
            await asyncio.sleep(_POLL_S)
        raise ReplicaStartError(f"replica {replica.name} not healthy after "
                                f"{self.settings.startup_timeout_s:.0f} s")

    async def _watch(self) -> None:
        failures: dict[str, int] = {}
        while not self._stopping:
            await asyncio.sleep(_HEALTH_EVERY_S)
            for replica in self.pool.ready():
                if await self._failed(replica, failures) and not self._stopping:
                    self._mark_down(replica)
                    self._spawn(self._restart(replica), f"grm-restart-{replica.name}")

    async def _failed(self, replica: Replica, failures: dict[str, int]) -> bool:
        try:
            alive = bool(await self._actors[replica.name].alive.remote())
        except ray.exceptions.RayError as err:  # the actor or its node is gone
            log.error("replica %s: actor lost: %s", replica.name, err)
            return True
        if not alive:
            log.error("replica %s: engine exited", replica.name)
            return True
        ok = await _healthy(self._client, replica.url)
        failures[replica.name] = 0 if ok else failures.get(replica.name, 0) + 1
        if failures[replica.name] < _HEALTH_FAILURES_DOWN:
            return False
        log.error("replica %s failed %d health checks", replica.name, failures.pop(replica.name))
        return True

    def _mark_down(self, replica: Replica) -> None:
        replica.state = ReplicaState.DOWN
        self.metrics.replica_up.labels(replica=replica.name).set(0)

    async def _restart(self, replica: Replica) -> None:
        """Kill the actor (its lifeline takes the engine down), place a new one in the same
        bundle with the same seed; backoff doubles up to its cap."""
        while not self._stopping:
            await self._stop_actor(replica.name)
            replica.restarts += 1
            self.metrics.replica_restarts.labels(replica=replica.name).inc()
            await asyncio.sleep(min(2.0 ** (replica.restarts - 1),
                                    self.settings.restart_backoff_max_s))
            try:
                await self._launch(replica)
                return
            except (ReplicaStartError, ray.exceptions.RayError) as err:
                log.error("restart of %s failed: %s", replica.name, err)

    async def _stop_actor(self, name: str) -> None:
        actor = self._actors.pop(name, None)
        if actor is None:
            return
        grace = self.settings.shutdown_grace_s
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
            await asyncio.wait_for(actor.stop.remote(grace), grace + 10)
        ray.kill(actor)

    async def stop(self) -> None:
        """Ordered and bounded: stop watching, stop every engine, kill actors, free the group."""
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for replica in self.pool.replicas:
            replica.state = ReplicaState.STOPPED
        if ray.is_initialized():
            await asyncio.gather(*(self._stop_actor(name) for name in list(self._actors)))
            if self._group is not None:
                remove_placement_group(self._group)
            await asyncio.to_thread(ray.shutdown)
        await self._client.aclose()
        log.info("Ray replicas stopped")
