from __future__ import annotations

import asyncio

from grm_service.replicas.pool import Gate


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
    from grm_service.replicas.pool import Replica

    r = Replica("r0", "u")
    assert [r.record(False, 10.0, 3, 5.0) for _ in range(3)] == [False, False, True]
    assert r.breaker_open(14.9) and not r.breaker_open(15.0)
    assert r.record(False, 11.0, 3, 5.0) is False, "already open: not reopened"
    r.record(True, 16.0, 3, 5.0)
    assert r.failures == 0
