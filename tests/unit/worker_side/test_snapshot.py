"""The keeper's replica set, published and followed: every worker routes over the same ready set."""

from __future__ import annotations

import asyncio
from pathlib import Path

from grm_service.config import Settings
from grm_service.gateway.request import router
from grm_service.gateway.request.router import looked_again
from grm_service.replicas.identity import ServiceIdentity
from grm_service.replicas.pool import Gate, ReplicaState
from grm_service.worker_side.snapshot import (
    INTERVAL_S,
    QUIET_INTERVAL_S,
    Follower,
    Published,
    mark_down,
    snapshot_of,
    write,
)
from tests.unit.replicas.test_keeper import PLAIN, identity, keeper_for


async def test_a_follower_sees_what_the_keeper_sees(tmp_path: Path) -> None:
    path = tmp_path / "replicas.json"
    keeper = keeper_for({"a": identity(), "b": identity(), "c": identity(dtype="float32"),
                         "d": PLAIN}, canary=False)
    published = Published(keeper, path)
    gates: list[Gate] = []

    def gate_for(index: int) -> Gate:
        gates.append(Gate())
        return gates[-1]

    held = ServiceIdentity(keeper.settings)
    follower = Follower(path, gate_for, held)
    await published.start()
    try:
        want = [ReplicaState.READY, ReplicaState.READY, ReplicaState.REJECTED,
                ReplicaState.REJECTED]
        async with asyncio.timeout(60):  # every replica checked, each change published
            while [r.state for r in keeper.pool.replicas] != want:
                await asyncio.sleep(0.01)
        keeper.pool.replicas[1].serialized = True
        published.publish()
        follower.refresh()
        keeper_view = snapshot_of(keeper.pool, keeper.admission.identity.reference)
        assert snapshot_of(follower.pool, held.reference) == keeper_view
        assert [r.state for r in follower.pool.replicas] == [
            ReplicaState.READY, ReplicaState.READY, ReplicaState.REJECTED, ReplicaState.REJECTED]
        assert follower.pool.replicas[1].serialized
        settled = held.reference
        assert settled is not None and settled == keeper.admission.identity.reference
        for key in range(200):  # the same request goes to the same replica in every worker
            ready_k = [r.name for r in keeper.pool.ready()]
            ready_f = [r.name for r in follower.pool.ready()]
            assert router.rendezvous_order(key, ready_f) == router.rendezvous_order(key, ready_k)

        version = follower.version
        mark_down(path, "the keeper's worker is restarting")
        follower.refresh()
        assert follower.pool.ready() == [] and follower.version == version + 1
        assert {r.detail for r in follower.pool.replicas} == {"the keeper's worker is restarting"}
        # A replica keeps its gate (and its holders) from one version to the next.
        assert [r.gate for r in follower.pool.replicas] == gates and len(gates) == 4
        assert held.reference is settled  # the reference did not change: not settled again
    finally:
        await published.stop()
    follower.refresh()
    assert {r.state for r in follower.pool.replicas} == {ReplicaState.STOPPED}


def test_a_quiet_worker_looks_less_often(tmp_path: Path) -> None:
    settings = Settings(replica_urls=["http://a:8000"], served_model_name="rm")
    quiet = [True]
    follower = Follower(tmp_path / "replicas.json", lambda index: Gate(),
                        ServiceIdentity(settings), quiet=lambda: quiet[0])
    assert follower.interval() == QUIET_INTERVAL_S > INTERVAL_S
    quiet[0] = False  # a request holds or awaits a slot: spares may be needed elsewhere
    assert follower.interval() == INTERVAL_S
    alone = Follower(tmp_path / "replicas.json", lambda index: Gate(), ServiceIdentity(settings))
    assert alone.interval() == INTERVAL_S


def test_a_worker_looks_again_before_it_refuses_for_want_of_a_ready_replica(
        tmp_path: Path) -> None:
    """A quiet worker's follower looks every 250 ms: a replica that came back may be ready in
    the snapshot (and in the /ready another worker answers) and not yet in this worker's pool.
    Before refusing, the worker looks again; without the look it refuses."""
    settings = Settings(replica_urls=["http://a:8000", "http://b:8000"],
                        served_model_name="rm")
    path = tmp_path / "replicas.json"

    def publish(r0: ReplicaState, version: int) -> None:
        write(path, {"version": version, "reference": None, "replicas": [
            {"name": name, "url": f"http://{name}:8000", "state": state.value, "restarts": 0,
             "pid": None, "detail": "", "serialized": False, "pooling_batched": False,
             "identity": None}
            for name, state in (("r0", r0), ("r1", ReplicaState.READY))]})

    publish(ReplicaState.RESTARTING, 1)
    follower = Follower(path, lambda index: Gate(), ServiceIdentity(settings), quiet=lambda: True)
    follower.refresh()
    pool = follower.pool
    # down in the snapshot too: none after the look (the request path refuses then)
    assert looked_again(pool, follower.look, 7, False, "r0") == []
    publish(ReplicaState.READY, 2)  # back, and the follower's loop has not looked yet
    assert looked_again(pool, None, 7, False, "r0") == []  # without the look
    assert [r.name for r in looked_again(pool, follower.look, 7, False, "r0")] == ["r0"]
    assert follower.version == 2
    path.write_text('{"version": 3, "repl')  # not what the keeper writes: logged, kept as was
    follower.look()
    assert follower.version == 2 and follower.pool.by_name("r0").ready
