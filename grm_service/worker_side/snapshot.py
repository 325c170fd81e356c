"""The replica set as the keeper sees it, published to the serving workers (`--workers N`).

One process runs the keeper (grm_service/workers/keeper_process.py). Every few tens of
milliseconds it compares what routing and the service identity read — each replica's name,
address, state, restarts, pid, detail, serialized and pooling-batched flags and admitted
identity, and the reference identity — with what it last published, and on a change writes it
to a small JSON file (write, then rename: a reader never sees half a snapshot) under a version
that grows with each change. The serving workers (followers) look at the file as often (a quiet
worker less often) and apply each new version to their own pool and settle their own
`ServiceIdentity` from it, so every worker routes over the same ready set, picks the same
replica for the same request, and answers /ready and /v1/fingerprint from the same facts.

Per worker, by design: the local half of each replica's gate (shared_gate.py) and the breaker
(each worker counts the failed attempts it saw itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grm_service.engine_side.identity import ReplicaIdentity
from grm_service.replicas.identity import ServiceIdentity
from grm_service.replicas.keeper import Keeper
from grm_service.replicas.pool import Gate, Replica, ReplicaPool, ReplicaState

log = logging.getLogger(__name__)

INTERVAL_S = 0.05
# A follower whose worker holds and awaits nothing looks this much less often: most of an idle
# worker's wake-ups were these looks (benchmarks/RESULTS.md, goal 2's workload without a GPU).
# While it is quiet it has no spares that a waiter elsewhere could need, and a request that
# meets a replica gone meanwhile fails over as it would within 50 ms.
QUIET_INTERVAL_S = 0.25

Snapshot = dict[str, Any]


def snapshot_of(pool: ReplicaPool, reference: ReplicaIdentity | None) -> Snapshot:
    return {
        "reference": reference.model_dump(mode="json") if reference else None,
        "replicas": [
            {"name": r.name, "url": r.url, "state": r.state.value, "restarts": r.restarts,
             "pid": r.pid, "detail": r.detail, "serialized": r.serialized,
             "pooling_batched": r.pooling_batched,
             "identity": r.identity.model_dump(mode="json") if r.identity else None}
            for r in pool.replicas
        ],
    }


def write(path: Path, snapshot: Snapshot) -> None:
    staged = path.with_name(path.name + ".new")
    staged.write_text(json.dumps(snapshot))
    os.replace(staged, path)


def read(path: Path) -> Snapshot | None:
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None


def mark_down(path: Path, why: str) -> None:
    """The keeper's process died: until its successor publishes, nothing is ready."""
    snapshot = read(path)
    if snapshot is None:
        return
    for fields in snapshot["replicas"]:
        fields["state"], fields["detail"] = ReplicaState.DOWN.value, why
    snapshot["version"] = int(snapshot.get("version", 0)) + 1
    write(path, snapshot)


def apply(pool: ReplicaPool, snapshot: Snapshot, gate_for: Callable[[int], Gate]) -> None:
    """Bring `pool` to the snapshot; a replica keeps its gate and breaker across versions."""
    for index, fields in enumerate(snapshot["replicas"]):
        replica = pool.by_name(fields["name"])
        if replica is None:
            replica = Replica(name=fields["name"], url=fields["url"], gate=gate_for(index))
            pool.replicas.append(replica)
        ident = fields["identity"]
        replica.url, replica.state = fields["url"], ReplicaState(fields["state"])
        replica.restarts, replica.pid = fields["restarts"], fields["pid"]
        replica.detail, replica.serialized = fields["detail"], fields["serialized"]
        replica.pooling_batched = fields["pooling_batched"]
        replica.identity = ReplicaIdentity.model_validate(ident) if ident else None


def reference_of(snapshot: Snapshot) -> ReplicaIdentity | None:
    ref = snapshot.get("reference")
    return ReplicaIdentity.model_validate(ref) if ref else None


class Published:
    """The keeper, in the process that runs it: its replica set written out on every change.
    (The manager stops it only once the serving workers have drained and exited, so their
    in-flight requests finish on running replicas.)"""

    def __init__(self, keeper: Keeper, path: Path) -> None:
        self.keeper = keeper
        self.pool = keeper.pool
        self.path = path
        self._last: Snapshot | None = None
        self._version = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="grm-snapshot-publisher")
        await self.keeper.start()

    async def _run(self) -> None:
        while True:
            try:
                self.publish()
            except Exception:  # a publisher that dies silently would freeze every follower
                log.exception("publishing the replica snapshot failed; retrying")
            await asyncio.sleep(INTERVAL_S)

    def publish(self) -> None:
        snapshot = snapshot_of(self.pool, self.keeper.admission.identity.reference)
        if snapshot == self._last:
            return
        self._last, self._version = snapshot, self._version + 1
        write(self.path, {"version": self._version, "keeper_pid": os.getpid(), **snapshot})

    async def stop(self) -> None:
        await self.keeper.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.publish()  # every replica stopped: what a follower still running would see


class Follower:
    """The replica set of a serving worker: the keeper's, as published; the reference identity
    it shows settles this process's `identity`."""

    def __init__(self, path: Path, gate_for: Callable[[int], Gate],
                 identity: ServiceIdentity, tend: Callable[[], None] | None = None,
                 quiet: Callable[[], bool] | None = None) -> None:
        self.pool = ReplicaPool()
        self.path = path
        self.identity = identity
        self._gate_for = gate_for
        self._tend = tend  # the gates' look for waiters, at each of this loop's turns
        self._quiet = quiet  # this worker holds no slot, keeps no spare, parks no request
        self._seen = b""
        self.version = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Follow the snapshots; return once one shows a ready replica."""
        self._task = asyncio.create_task(self._run(), name="grm-snapshot-follower")
        while not self.pool.ready():
            await asyncio.sleep(INTERVAL_S)

    async def _run(self) -> None:
        while True:
            if self.look() and self._tend is not None:
                try:
                    self._tend()
                except Exception:
                    log.exception("tending the replica gates failed; retrying")
            await asyncio.sleep(self.interval())

    def look(self) -> bool:
        """`refresh`, its failure logged (the next look tries again): the loop's, and one
        before a request is refused for want of a ready replica, and by /ready
        (`ForwardContext.look`). False where the read failed."""
        try:
            self.refresh()
        except Exception:
            log.exception("reading the replica snapshot failed; retrying")
            return False
        return True

    def interval(self) -> float:
        """Seconds until the next look."""
        return QUIET_INTERVAL_S if self._quiet is not None and self._quiet() else INTERVAL_S

    def refresh(self) -> None:
        """Apply the published snapshot if it changed since the last look (a small read)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        if raw == self._seen:
            return
        snapshot = dict(json.loads(raw))
        self._seen = raw
        apply(self.pool, snapshot, self._gate_for)
        self.version = int(snapshot.get("version", 0))
        reference = reference_of(snapshot)
        if reference is not None:
            self.identity.settle(reference)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
