"""Paired rounds: every contender runs once per round, in an order that changes, and figures are
read per round or as the median of the rounds with their range.

A shared machine's pace drifts by more than many differences measured here, so contenders are
compared within one run, round by round, never across runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def order(items: Sequence[T], rnd: int) -> list[T]:
    """Round `rnd`'s order: reversed every other round and rotated by one every second round,
    so no contender always runs first or right after the same neighbour (rotation alone kept a
    tree right after its `-before` copy, and one such pair of identical code measured 0.84-0.94
    of itself: gpu/RESULTS.md's history); two contenders each go first in half the rounds."""
    turn = (rnd // 2) % len(items) if items else 0
    out = [*items[turn:], *items[:turn]]
    return out[::-1] if rnd % 2 else out


def spread(values: Sequence[float], spec: str = ".1f") -> str:
    """`median [min-max]` of the rounds' values."""
    return (f"{format(statistics.median(values), spec)} "
            f"[{format(min(values), spec)}-{format(max(values), spec)}]")
