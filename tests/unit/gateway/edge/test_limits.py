"""When the edge hands freed memory back: after a quiet tick, not at a gap inside a burst.

The edge's timers run by hand here (`Ticks`): a tick passes when the test says so, so what is
checked is the decision at each tick, not how late a loaded machine's event loop wakes up (a
test that slept 1.5 ticks of 50 ms once saw two pass).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from grm_service.config import Settings
from grm_service.gateway.edge import limits as limits_module
from grm_service.gateway.edge.limits import EdgeLimits

MIB = 1 << 20


class Ticks:
    """Stands in for the running loop's `call_later` and `run_in_executor` in limits.py."""

    def __init__(self) -> None:
        self.due: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self.trims = 0

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        self.due.append((callback, args))

    def run_in_executor(self, executor: None, work: Callable[[], None]) -> None:
        self.trims += 1

    def tick(self) -> None:
        """One tick passes: what was due within it runs, in the order it was asked."""
        due, self.due = self.due, []
        for callback, args in due:
            callback(*args)


@pytest.fixture
def ticks(monkeypatch: pytest.MonkeyPatch) -> Ticks:
    ticks = Ticks()
    monkeypatch.setattr(limits_module, "asyncio", SimpleNamespace(get_running_loop=lambda: ticks))
    return ticks


def _limits() -> EdgeLimits:
    # a trim after 1 MiB has come in
    return EdgeLimits(Settings(model="/models/m", header_timeout_s=0.2, malloc_keep_bytes=4 * MIB))


def test_a_gap_inside_a_burst_does_not_trim_the_quiet_after_it_does(ticks: Ticks) -> None:
    limits = _limits()
    assert limits.take(2 * MIB)
    limits.give(2 * MIB)  # nothing in flight: a trim is due if nothing comes in for a tick
    assert limits.trim_pending
    assert limits.take(MIB)  # the burst goes on within the tick
    ticks.tick()
    assert limits.moved == 3 * MIB and not limits.trim_pending  # not trimmed: in flight
    limits.give(MIB)
    assert limits.take(MIB)  # another gap, filled again at once: the quiet tick starts over
    limits.give(MIB)
    ticks.tick()
    assert limits.moved == 4 * MIB and ticks.trims == 0
    ticks.tick()
    assert limits.moved == 0 and not limits.trim_pending  # trimmed: a tick with nothing new
    assert ticks.trims == 1


def test_a_small_burst_is_not_trimmed(ticks: Ticks) -> None:
    limits = _limits()
    assert limits.take(MIB // 2)
    limits.give(MIB // 2)
    assert not limits.trim_pending
    ticks.tick()
    ticks.tick()
    assert limits.moved == MIB // 2 and ticks.trims == 0
