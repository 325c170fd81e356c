"""When the edge hands freed memory back: after a quiet tick, not at a gap inside a burst."""

from __future__ import annotations

import asyncio

from grm_service.config import Settings
from grm_service.gateway.edge.limits import EdgeLimits

MIB = 1 << 20


def _limits() -> EdgeLimits:
    # a tick of 50 ms (a quarter of the header timeout); a trim after 1 MiB has come in
    return EdgeLimits(Settings(model="/models/m", header_timeout_s=0.2, malloc_keep_bytes=4 * MIB))


async def test_a_gap_inside_a_burst_does_not_trim_the_quiet_after_it_does() -> None:
    limits = _limits()
    tick = limits.tick_s
    assert limits.take(2 * MIB)
    limits.give(2 * MIB)  # nothing in flight: a trim is due if nothing comes in for a tick
    assert limits.trim_pending
    assert limits.take(MIB)  # the burst goes on within the tick
    await asyncio.sleep(tick * 1.5)
    assert limits.moved == 3 * MIB and not limits.trim_pending  # not trimmed: in flight
    limits.give(MIB)
    assert limits.take(MIB)  # another gap, filled again at once: the quiet tick starts over
    limits.give(MIB)
    await asyncio.sleep(tick * 1.5)
    assert limits.moved == 4 * MIB
    await asyncio.sleep(tick * 2)
    assert limits.moved == 0 and not limits.trim_pending  # trimmed: a tick with nothing new


async def test_a_small_burst_is_not_trimmed() -> None:
    limits = _limits()
    assert limits.take(MIB // 2)
    limits.give(MIB // 2)
    assert not limits.trim_pending
    await asyncio.sleep(limits.tick_s * 2)
    assert limits.moved == MIB // 2
