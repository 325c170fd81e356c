"""The replica keeper: the one lifecycle every replica shares, wherever it runs.

    starting -> checking -> ready -> down -> restarting -> starting ...
                   `-> rejected -> restarting            (stopped: final, at shutdown)

(A replica started elsewhere has no restart: once out it stays down or rejected, re-probed every
health interval, until it is admitted again.)

A replica *source* only knows how to start (or locate), stop and describe its replica: a local
process (`sources.LocalSource`), an address started elsewhere (`sources.AttachedSource`), a Ray
actor (`launchers.ray.RaySource`). The keeper owns the rest, once: health probing, admission
(identity, then the canary), the watch, and the restart loop with a capped backoff whose counter
resets after a stable period. Each replica has its own task, and a bug met while keeping one
replica is logged with the replica's name and the loop goes on: a monitor that dies silently
would leave a dead replica routed to and a recovered one never re-admitted.

Replicas that share a GPU start one at a time: vLLM sizes its KV cache from the memory it sees
free while it profiles, and a neighbour allocating at that moment makes the start fail ("No
available memory for the cache blocks", seen with two replicas on one H200). A start holds its
devices' lanes until the replica answers its health check or fails; replicas on other devices,
and CPU replicas, start together.

The gateway serves as soon as one replica is admitted. A replica that fails to start is retried;
only when every replica launched by this gateway failed its first start (a bad model path or
engine argument, most likely) does `start` raise, with the first failure's log tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from enum import Enum

import httpx

from grm_service.config import Settings
from grm_service.errors import ConfigError
from grm_service.metrics import Metrics
from grm_service.replicas.admission import Admission
from grm_service.replicas.pool import Replica, ReplicaPool, ReplicaState
from grm_service.replicas.status import ReplicaStatus

log = logging.getLogger(__name__)

_POLL_S = 0.5
_PROBE_TIMEOUT_S = 5.0
_MISSES_DOWN = 3
_EARLIER_FIRST_MAX_S = 120.0
_MAX_EXPONENT = 16  # 2**16 s is far beyond any cap: the exponent stops growing, nothing overflows


class ReplicaStartError(ConfigError):
    """No replica of this gateway came up; the message carries the first one's log tail."""


class StartFailed(Exception):
    """This start of one replica failed (the keeper retries it)."""


class ReplicaSource(ABC):
    """Start, stop and locate one replica; everything else is the keeper's."""

    owns_process: bool = True

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def pid(self) -> int | None:
        return None

    @property
    def devices(self) -> tuple[int, ...]:
        """The GPUs this replica's engine takes on this host, where the keeper starts it:
        no other replica starts on one of them at the same time."""
        return ()

    @abstractmethod
    async def start(self) -> str:
        """Launch (or locate) the replica; its base URL."""

    async def exited(self) -> str | None:
        """Why the replica's process is gone, or None while it runs (or is not ours to see)."""
        return None

    async def stop(self, grace_s: float) -> None:
        """Stop the replica's process, bounded by grace_s; nothing for a replica not ours."""
        return None

    async def tail(self) -> str:
        """The last lines of the replica's output, where we have them."""
        return ""


def backoff_s(failures: int, base_s: float, cap_s: float) -> float:
    """Doubles with each failure in a row, up to the cap; any count is safe."""
    if failures <= 0:
        return 0.0
    return min(cap_s, base_s * 2.0 ** min(failures - 1, _MAX_EXPONENT))


class Probe(Enum):
    OK = "ok"
    REFUSED = "refused"  # nothing listens: the replica is gone, no need to wait for more misses
    BAD = "bad"


async def probe(client: httpx.AsyncClient, url: str) -> Probe:
    try:
        response = await client.get(url + "/health", timeout=_PROBE_TIMEOUT_S)
    except httpx.ConnectError:
        return Probe.REFUSED
    except httpx.HTTPError:
        return Probe.BAD
    return Probe.OK if response.status_code == 200 else Probe.BAD


class Keeper:
    """Owns every replica's lifecycle and keeps `pool` in step with it."""

    def __init__(self, settings: Settings, metrics: Metrics, sources: Sequence[ReplicaSource],
                 admission: Admission, client: httpx.AsyncClient) -> None:
        self.settings = settings
        self.metrics = metrics
        self._status = ReplicaStatus(metrics)
        self.admission = admission
        self.pool = ReplicaPool([Replica(name=s.name, url="") for s in sources])
        self._sources = {s.name: s for s in sources}
        self._client = client
        self._tasks: list[asyncio.Task[None]] = []
        self._first: asyncio.Future[None] | None = None
        self._first_failures: dict[str, str] = {}
        self._lanes: dict[int, asyncio.Lock] = {}  # a GPU's: one start on it at a time
        self._stopping = False

    async def start(self) -> None:
        """Start keeping every replica; return once one is admitted (see the module doc)."""
        self._first = asyncio.get_running_loop().create_future()
        for replica in self.pool.replicas:
            source = self._sources[replica.name]
            self._tasks.append(asyncio.create_task(self._keep(source, replica),
                                                   name=f"grm-keeper-{replica.name}"))
        started = time.monotonic()
        await self._first
        log.info("first replica admitted after %.1f s", time.monotonic() - started)

    async def _keep(self, source: ReplicaSource, replica: Replica) -> None:
        while not self._stopping:
            try:
                await self._cycle(source, replica)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("keeper of replica %s met an unexpected error; continuing",
                              replica.name)
                await self._stop_source(source)
            if self._stopping:
                return
            await self._pause(source, replica)

    async def _cycle(self, source: ReplicaSource, replica: Replica) -> None:
        """One life: start, check, serve until down. Returns when the replica must be retried."""
        # A replica started elsewhere that is being re-probed keeps showing why it is out.
        quiet = not source.owns_process and replica.start_failures > 0
        if not quiet:
            self._set(replica, ReplicaState.STARTING)
        try:
            async with self._start_lanes(source, replica):
                replica.url = await source.start()
                replica.pid = source.pid
                if not quiet:
                    self._set(replica, ReplicaState.CHECKING)
                await self._until_healthy(source, replica)
        except StartFailed as err:
            self._start_failed(replica, str(err))
            await self._stop_source(source)
            return
        await self._earlier_first(replica)
        if problem := await self.admission.check(replica):
            self._set(replica, ReplicaState.REJECTED, problem)
            self._start_failed(replica, f"replica {replica.name} refused: {problem}")
            await self._stop_source(source)
            return
        await self._serve(source, replica)

    @contextlib.asynccontextmanager
    async def _start_lanes(self, source: ReplicaSource, replica: Replica) -> AsyncIterator[None]:
        """Hold the lanes of the source's devices (in one order: no two starts wait on each
        other) for as long as the body runs."""
        waited = False
        async with contextlib.AsyncExitStack() as held:
            for device in sorted(set(source.devices)):
                lane = self._lanes.setdefault(device, asyncio.Lock())
                if lane.locked():
                    waited = True
                    self._set(replica, ReplicaState.STARTING,
                              f"waiting for another replica's start on GPU {device}")
                await held.enter_async_context(lane)
            if waited:
                self._set(replica, ReplicaState.STARTING)
            yield

    async def _earlier_first(self, replica: Replica) -> None:
        """Until there is a reference, replicas earlier in the list that are still being
        started or checked go first, so the reference is r0's when r0 comes up with the others
        (a stable rule, not whichever answered first); bounded, so a slow one cannot hold the
        service back for long."""
        index = self.pool.replicas.index(replica)
        deadline = time.monotonic() + _EARLIER_FIRST_MAX_S
        while (self.admission.identity.reference is None and time.monotonic() < deadline
               and any(r.state is ReplicaState.CHECKING for r in self.pool.replicas[:index])):
            await asyncio.sleep(_POLL_S)

    async def _serve(self, source: ReplicaSource, replica: Replica) -> None:
        self._set(replica, ReplicaState.READY)
        if self._first is not None and not self._first.done():
            self._first.set_result(None)
        why = await self._watch(source, replica)
        if self._stopping:
            return
        log.error("replica %s is down: %s", replica.name, why)
        self._status.error(replica.name, why)
        self._set(replica, ReplicaState.DOWN, why)
        await self._stop_source(source)

    async def _until_healthy(self, source: ReplicaSource, replica: Replica) -> None:
        if not source.owns_process:  # started elsewhere: up or not, no start-up to wait out
            if (result := await probe(self._client, replica.url)) is not Probe.OK:
                raise StartFailed(f"replica {source.name} health check: {result.value}")
            return
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while time.monotonic() < deadline:
            if (why := await source.exited()) is not None:
                raise StartFailed(await self._failure(source, why))
            if await probe(self._client, replica.url) is Probe.OK:
                return
            await asyncio.sleep(_POLL_S)
        limit = self.settings.startup_timeout_s
        raise StartFailed(await self._failure(source, f"not healthy after {limit:.0f} s"))

    async def _watch(self, source: ReplicaSource, replica: Replica) -> str:
        """Until the replica fails: its process exits, nothing listens, or misses pile up."""
        ready_since, misses = time.monotonic(), 0
        while not self._stopping:
            await asyncio.sleep(self.settings.health_interval_s)
            if (why := await source.exited()) is not None:
                return await self._failure(source, why)
            result = await probe(self._client, replica.url)
            if result is Probe.REFUSED:
                return "connection refused"
            misses = 0 if result is Probe.OK else misses + 1
            if misses >= _MISSES_DOWN:
                return f"failed {misses} health checks in a row"
            if replica.start_failures and (
                    time.monotonic() - ready_since >= self.settings.restart_stable_s):
                replica.start_failures = 0  # stable again: the next failure starts from 1 s
        return "stopping"

    async def _pause(self, source: ReplicaSource, replica: Replica) -> None:
        """Wait before the next start: a capped backoff for our processes; for replicas started
        elsewhere, the health interval (re-probing costs nothing, waiting delays re-admission)."""
        replica.start_failures += 1
        if source.owns_process:
            replica.restarts += 1
            self.metrics.replica_restarts.labels(replica=replica.name).inc()
            delay = backoff_s(replica.start_failures, 1.0, self.settings.restart_backoff_max_s)
        else:
            delay = self.settings.health_interval_s
        if source.owns_process and replica.state is not ReplicaState.REJECTED:
            self._set(replica, ReplicaState.RESTARTING, replica.detail)
        await asyncio.sleep(delay)

    def _start_failed(self, replica: Replica, message: str) -> None:
        # Once per run of failures: a replica down for an hour must not log every probe.
        log.log(logging.DEBUG if replica.start_failures else logging.ERROR, "%s", message)
        self._status.start_failed(replica.name, message)
        if replica.state is not ReplicaState.REJECTED:
            self._set(replica, ReplicaState.DOWN, message.splitlines()[0])
        if replica.name not in self._first_failures and replica.restarts == 0:
            self._first_failures[replica.name] = message
        every_source_ours = all(s.owns_process for s in self._sources.values())
        if (every_source_ours and self._first is not None and not self._first.done()
                and len(self._first_failures) == len(self._sources)):
            first = self._first_failures[self.pool.replicas[0].name]
            self._first.set_exception(ReplicaStartError(first))

    async def _failure(self, source: ReplicaSource, what: str) -> str:
        tail = await source.tail()
        text = f"replica {source.name} {what}"
        return f"{text}; last lines:\n{tail}" if tail else text

    async def _stop_source(self, source: ReplicaSource) -> None:
        try:
            await source.stop(self.settings.shutdown_grace_s)
        except Exception:
            log.exception("stopping replica %s failed", source.name)

    def _set(self, replica: Replica, state: ReplicaState, detail: str = "") -> None:
        if (state, detail) != (replica.state, replica.detail):
            log.info("replica %s (%s) is %s%s", replica.name, replica.url or "-", state.value,
                     f": {detail.splitlines()[0]}" if detail else "")
        replica.state, replica.detail = state, detail
        self._status.state(replica.name, state)

    async def stop(self) -> None:
        """Ordered and bounded: stop watching, then stop every replica in parallel."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for replica in self.pool.replicas:
            replica.state = ReplicaState.STOPPED
        await asyncio.gather(*(self._stop_source(s) for s in self._sources.values()))
