"""The keeper and admission, on MockTransport replicas: identity checks, survival, backoff."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from grm_service.config import Settings
from grm_service.engine_side.identity import IDENTITY_PATH
from grm_service.metrics import Metrics
from grm_service.replicas.admission import Admission
from grm_service.replicas.keeper import (
    Keeper,
    ReplicaSource,
    ReplicaStartError,
    StartFailed,
    backoff_s,
)
from grm_service.replicas.sources import attached_sources

INPUTS = {"engine": "vllm", "engine_version": "0.25.0", "device": "NVIDIA H200 (driver 1)",
          "env": {"VLLM_BATCH_INVARIANT": "1"}, "numerics": {"dtype": "bfloat16"}}


def identity(**over: Any) -> dict[str, Any]:
    inputs = {**INPUTS, "numerics": {"dtype": over.pop("dtype", "bfloat16")}}
    base = {"verified": True, "served_model": "rm", "engine": "vllm", "engine_version": "0.25.0",
            "model_hash": "blake3:aa", "env_digest": "e1", "device": "NVIDIA H200 (driver 1)",
            "tensor_parallel_size": 1, "env_inputs": inputs}
    return {**base, **over}


PLAIN = {"plain": True, "model": "rm", "root": "/models/rm", "len": 512, "version": "0.25.0"}


def handler(replicas: dict[str, dict[str, Any]]) -> httpx.MockTransport:
    """Each host answers as its dict says: an identity, a plain vLLM server, or a fault."""

    async def handle(request: httpx.Request) -> httpx.Response:
        r = replicas[request.url.host]
        if request.url.path == "/health" and r.get("slow_health"):
            await asyncio.sleep(r["slow_health"])
        fault = r.get("fault")
        if fault == "down":
            raise httpx.ConnectError("refused", request=request)
        if fault == "hang":
            raise httpx.ReadTimeout("hang", request=request)
        if fault == "html":
            return httpx.Response(200, text="<html>hello</html>")
        if fault == "badjson":
            return httpx.Response(200, text='{"verified": tru')
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == IDENTITY_PATH and not r.get("plain"):
            return httpx.Response(200, json=r)
        if path == "/version":
            return httpx.Response(200, json={"version": r["version"]})
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": r["model"], "root": r["root"], "max_model_len": r["len"]}]})
        return httpx.Response(404)

    return httpx.MockTransport(handle)


def keeper_for(replicas: dict[str, dict[str, Any]], **settings: Any) -> Keeper:
    s = Settings(replica_urls=[f"http://{h}:8000" for h in replicas], served_model_name="rm",
                 health_interval_s=0.05, **settings)
    client = httpx.AsyncClient(transport=handler(replicas))
    return Keeper(s, Metrics(), attached_sources(s), Admission(s, client), client)


async def settled(keeper: Keeper, done: Callable[[list[str]], bool], rounds: int = 5,
                  timeout_s: float = 60.0) -> list[str]:
    """The replicas' states once `done` holds for them and a few health rounds more (a state
    reached must stay), or at the deadline for the caller's assert to show: as many rounds as
    a loaded machine needs, never a fixed time."""
    deadline = time.monotonic() + timeout_s
    while not done(states := [r.state.value for r in keeper.pool.replicas]):
        if time.monotonic() > deadline:
            return states
        await asyncio.sleep(0.01)
    await asyncio.sleep(keeper.settings.health_interval_s * rounds)
    return [r.state.value for r in keeper.pool.replicas]


async def test_same_identity_is_admitted_and_each_difference_is_named() -> None:
    keeper = keeper_for({"a": identity(), "b": identity(), "c": identity(dtype="float32"),
                         "d": identity(model_hash="blake3:bb"), "e": PLAIN})
    await keeper.start()
    try:
        want = ["ready", "ready", "rejected", "rejected", "rejected"]
        assert await settled(keeper, want.__eq__) == want
        detail = {r.name: r.detail for r in keeper.pool.replicas}
        assert "env input numerics.dtype 'float32' != 'bfloat16'" in detail["r2"]
        assert "model hash 'blake3:bb' != 'blake3:aa'" in detail["r3"]
        assert "identity 'unverified' != 'verified'" in detail["r4"]
    finally:
        await keeper.stop()


async def test_the_first_replica_in_the_list_sets_the_reference_when_both_are_up() -> None:
    # r0 answers its health check late; r1 (other numerics) must not become the reference.
    keeper = keeper_for({"a": identity(slow_health=0.3), "b": identity(dtype="float32")})
    await keeper.start()
    try:
        assert await settled(keeper, ["ready", "rejected"].__eq__) == ["ready", "rejected"]
        assert "numerics.dtype 'float32' != 'bfloat16'" in keeper.pool.replicas[1].detail
    finally:
        await keeper.stop()


async def test_a_plain_vllm_server_is_served_unverified_with_nothing_made_up() -> None:
    keeper = keeper_for({"a": PLAIN, "b": dict(PLAIN)})
    await keeper.start()
    try:
        assert await settled(keeper, ["ready", "ready"].__eq__) == ["ready", "ready"]
        ident = keeper.pool.replicas[0].identity
        assert ident is not None and not ident.verified
        assert ident.model_hash is None and ident.env_digest is None and ident.device is None
        assert "model_hash" in ident.unknown and "device" in ident.unknown
        assert ident.fingerprint_id(42).startswith("grm-unverified-")
    finally:
        await keeper.stop()


async def test_garbage_replicas_are_refused_and_the_watch_goes_on() -> None:
    replicas = {"good": identity(), "html": {"fault": "html"}, "json": {"fault": "badjson"},
                "hang": {"fault": "hang"}, "other": identity()}
    keeper = keeper_for(replicas)
    await keeper.start()
    try:
        def refused(states: list[str]) -> bool:
            return all(s in ("rejected", "down", "restarting") for s in states[1:4])

        states = await settled(keeper, lambda s: s[0] == s[4] == "ready" and refused(s))
        assert states[0] == "ready" and states[4] == "ready"
        assert all(s in ("rejected", "down", "restarting", "checking") for s in states[1:4])
        replicas["other"]["fault"] = "down"  # killed
        assert (await settled(keeper, lambda s: s[4] != "ready"))[4] != "ready"
        del replicas["other"]["fault"]  # back
        assert (await settled(keeper, lambda s: s[4] == "ready"))[4] == "ready"
        replicas["html"].clear()
        replicas["html"].update(identity())  # fixed: admitted on a later round
        assert (await settled(keeper, lambda s: s[1] == "ready"))[1] == "ready"
    finally:
        await keeper.stop()


def test_backoff_is_capped_and_never_overflows() -> None:
    assert backoff_s(0, 1.0, 30.0) == 0.0
    assert [backoff_s(n, 1.0, 30.0) for n in (1, 2, 3, 5, 6)] == [1.0, 2.0, 4.0, 16.0, 30.0]
    assert backoff_s(1025, 1.0, 30.0) == 30.0
    assert backoff_s(10**9, 1.0, 30.0) == 30.0


class FailingSource(ReplicaSource):
    """Fails every start: with StartFailed (a start that did not work) or with any other
    exception (a bug in a source), which the keeper must log and survive alike."""

    def __init__(self, name: str, error: type[Exception] = StartFailed) -> None:
        super().__init__(name)
        self.error = error
        self.starts = 0

    async def start(self) -> str:
        self.starts += 1
        raise self.error(f"start {self.starts} failed")


async def test_thousands_of_restarts_neither_overflow_nor_stop_the_loop() -> None:
    settings = Settings(model="m", restart_backoff_max_s=1e-4)
    client = httpx.AsyncClient(transport=handler({}))
    failing, broken = FailingSource("r0"), FailingSource("r1", RuntimeError)
    keeper = Keeper(settings, Metrics(), [failing, broken], Admission(settings, client), client)
    starting = asyncio.create_task(keeper.start())
    try:
        deadline = time.monotonic() + 60  # a count, not a pace: a loaded machine gets longer
        while time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            if failing.starts > 1100 and broken.starts > 1100:
                break
        assert failing.starts > 1100 and broken.starts > 1100
        assert keeper.pool.replicas[0].restarts >= 1100
    finally:
        starting.cancel()
        await keeper.stop()


async def test_gateway_start_fails_only_when_every_launched_replica_failed() -> None:
    settings = Settings(model="m", restart_backoff_max_s=1e-3)
    client = httpx.AsyncClient(transport=handler({}))
    keeper = Keeper(settings, Metrics(), [FailingSource("r0")], Admission(settings, client),
                    client)
    with pytest.raises(ReplicaStartError, match="start 1 failed"):
        await keeper.start()
    await keeper.stop()


class GpuSource(ReplicaSource):
    """A replica of ours on `devices`, healthy `warm_s` after its start (its events logged)."""

    def __init__(self, name: str, devices: tuple[int, ...], events: list[str],
                 warm_s: float = 0.3) -> None:
        super().__init__(name)
        self._devices, self.events, self.warm_s = devices, events, warm_s
        self.started_at: float | None = None

    @property
    def devices(self) -> tuple[int, ...]:
        return self._devices

    async def start(self) -> str:
        self.events.append(f"{self.name} start")
        self.started_at = time.monotonic()
        return f"http://{self.name}:8000"


def warming(sources: list[GpuSource]) -> httpx.MockTransport:
    """Each source's /health is 503 until `warm_s` after its start; the rest as `handler`."""
    by_host = {s.name: s for s in sources}
    rest = handler({s.name: identity() for s in sources})

    async def handle(request: httpx.Request) -> httpx.Response:
        source = by_host[request.url.host]
        if request.url.path != "/health":
            return await rest.handle_async_request(request)
        started = source.started_at
        if started is None or time.monotonic() - started < source.warm_s:
            return httpx.Response(503)
        if f"{source.name} healthy" not in source.events:
            source.events.append(f"{source.name} healthy")
        return httpx.Response(200)

    return httpx.MockTransport(handle)


async def test_replicas_that_share_a_gpu_start_one_after_the_other() -> None:
    """vLLM sizes its KV cache from the memory free while it profiles: a neighbour starting at
    that moment fails the start. r0 and r1 share GPU 0, r2 has GPU 1 to itself."""
    events: list[str] = []
    sources = [GpuSource("r0", (0,), events), GpuSource("r1", (0,), events),
               GpuSource("r2", (1,), events)]
    settings = Settings(model="m", served_model_name="rm", health_interval_s=0.05)
    client = httpx.AsyncClient(transport=warming(sources))
    keeper = Keeper(settings, Metrics(), sources, Admission(settings, client), client)
    starting = asyncio.create_task(keeper.start())
    try:
        seen = set()  # r1 while r0 warms up (at least one health poll, _POLL_S)
        async with asyncio.timeout(60):  # a bound on a hang, not a pace: r0 needs about 0.5 s
            while "r0 healthy" not in events:
                if "r0 start" in events:
                    r1 = keeper.pool.replicas[1]
                    seen.add((r1.state.value, r1.detail))
                await asyncio.sleep(0.01)
        assert seen == {("starting", "waiting for another replica's start on GPU 0")}
        await starting
        states = await settled(keeper, lambda s: s == ["ready"] * 3)
        assert states == ["ready"] * 3
    finally:
        await keeper.stop()
    assert events.index("r1 start") > events.index("r0 healthy")
    assert events.index("r2 start") < events.index("r0 healthy")
