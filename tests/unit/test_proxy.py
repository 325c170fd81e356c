from __future__ import annotations

import asyncio

import pytest

from grm_service.config import SerializeMode, Settings
from grm_service.engines import Capabilities
from grm_service.errors import StreamingUnsupported, UnknownModel
from grm_service.proxy import must_run_alone, prepare
from grm_service.replicas import Gate

SETTINGS = Settings(model="/models/m", served_model_name="rm", seed=7, max_tokens_default=99)
MSGS = [{"role": "user", "content": "hi"}]


def test_prepare_injects_seed_max_tokens_and_model() -> None:
    body = prepare({"messages": MSGS}, SETTINGS)
    assert body == {"messages": MSGS, "seed": 7, "max_tokens": 99, "model": "rm"}


def test_prepare_keeps_client_values() -> None:
    given = {"messages": MSGS, "seed": 0, "max_tokens": 5, "model": "rm", "top_p": 0.8}
    assert prepare(given, SETTINGS) == given
    assert "max_tokens" not in prepare({"messages": MSGS, "max_completion_tokens": 3}, SETTINGS)


def test_prepare_refuses_streaming_and_unknown_models() -> None:
    with pytest.raises(StreamingUnsupported, match="stream=false"):
        prepare({"messages": MSGS, "stream": True}, SETTINGS)
    with pytest.raises(UnknownModel, match="'rm'"):
        prepare({"messages": MSGS, "model": "other"}, SETTINGS)
    assert "stream" not in prepare({"messages": MSGS, "stream": False}, SETTINGS)


BI = Capabilities(batch_invariant=True, sampling_invariant=True, note="")
BI_NO_TOPP = Capabilities(batch_invariant=True, sampling_invariant=False, note="")
NO_BI = Capabilities(batch_invariant=False, sampling_invariant=False, note="")


@pytest.mark.parametrize(
    ("body", "caps", "mode", "alone"),
    [
        ({"top_p": 0.8}, BI, SerializeMode.AUTO, False),
        ({"top_p": 0.8}, BI_NO_TOPP, SerializeMode.AUTO, True),
        ({"top_p": 1.0}, BI_NO_TOPP, SerializeMode.AUTO, False),
        ({}, BI_NO_TOPP, SerializeMode.AUTO, True),  # generation config may set top_p
        ({"temperature": 0}, BI_NO_TOPP, SerializeMode.AUTO, False),
        ({"top_p": 1.0, "top_k": 20}, BI_NO_TOPP, SerializeMode.AUTO, True),
        ({"temperature": 0}, NO_BI, SerializeMode.AUTO, True),
        ({"temperature": 0}, BI, SerializeMode.ON, True),
        ({"top_p": 0.5}, NO_BI, SerializeMode.OFF, False),
    ],
)
def test_must_run_alone(body: dict, caps: Capabilities, mode: SerializeMode, alone: bool) -> None:
    assert must_run_alone(body, caps, mode) is alone


async def test_gate_exclusive_waits_for_shared_and_blocks_new_ones() -> None:
    gate = Gate()
    events: list[str] = []
    release = asyncio.Event()

    async def shared(tag: str) -> None:
        async with gate.shared():
            events.append(f"{tag}+")
            await release.wait()
            events.append(f"{tag}-")

    async def exclusive() -> None:
        async with gate.exclusive():
            events.append("X+")
            assert gate.inflight == 1
            events.append("X-")

    first = asyncio.create_task(shared("a"))
    await asyncio.sleep(0.01)
    excl = asyncio.create_task(exclusive())
    await asyncio.sleep(0.01)
    late = asyncio.create_task(shared("b"))
    await asyncio.sleep(0.01)
    assert events == ["a+"], "exclusive must wait; later shared must queue behind it"
    release.set()
    await asyncio.gather(first, excl, late)
    assert events == ["a+", "a-", "X+", "X-", "b+", "b-"]
    assert gate.inflight == 0


async def test_gate_shared_requests_overlap() -> None:
    gate = Gate()
    peak = 0

    async def one() -> None:
        nonlocal peak
        async with gate.shared():
            peak = max(peak, gate.inflight)
            await asyncio.sleep(0.01)

    await asyncio.gather(*(one() for _ in range(5)))
    assert peak == 5


def test_breaker_opens_after_threshold_and_closes_on_success() -> None:
    from grm_service.replicas import Replica

    r = Replica("r0", "u")
    assert [r.record(False, 10.0, 3, 5.0) for _ in range(3)] == [False, False, True]
    assert r.breaker_open(14.9) and not r.breaker_open(15.0)
    assert r.record(False, 11.0, 3, 5.0) is False, "already open: not reopened"
    r.record(True, 16.0, 3, 5.0)
    assert r.failures == 0


def test_route_skips_open_breakers_unless_all_are_open() -> None:
    import time

    from grm_service.metrics import Metrics
    from grm_service.proxy import Gateway, route
    from grm_service.replicas import Replica, ReplicaPool, ReplicaState
    from grm_service.upstream import Upstream

    pool = ReplicaPool([Replica(n, "u", state=ReplicaState.READY) for n in ("r0", "r1")])
    gw = Gateway(settings=SETTINGS, capabilities=BI, pool=pool, client=Upstream(1.0),
                 metrics=Metrics())
    pool.replicas[0].open_until = time.monotonic() + 60
    assert [r.name for r in route(gw, 123)] == ["r1"]
    assert [r.name for r in route(gw, 123, pin="r0")] == ["r0"], "a pin overrides"
    pool.replicas[1].open_until = time.monotonic() + 60
    assert {r.name for r in route(gw, 123)} == {"r0", "r1"}
