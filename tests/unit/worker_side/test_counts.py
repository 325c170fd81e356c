"""The count map the workers share, opened twice on one file as two workers open it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from grm_service.worker_side.counts import LEASED, SLOTS, WAITERS, WRITERS, Counts, counts_path

WORKERS = 3


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Counts, Counts]]:
    path = counts_path(tmp_path / "gates")
    first, second = Counts(path, 0, WORKERS), Counts(path, 2, WORKERS)
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def test_each_worker_writes_its_own_slot_and_reads_the_sum(pair: tuple[Counts, Counts]) -> None:
    first, second = pair
    first.add(5, 3)
    second.add(5, 2)
    assert first.total(5) == second.total(5) == 5
    assert first.total(4) == 0, "replicas apart"
    assert second.row(0, 5) == [3, 0, 2]


def test_a_worker_opening_the_map_zeroes_only_its_own_slots(
        tmp_path: Path, pair: tuple[Counts, Counts]) -> None:
    first, second = pair
    first.add(1, 4)
    second.add(1, 1)
    second.park(1, 1, SLOTS)
    Counts(counts_path(tmp_path / "gates"), 2, WORKERS).close()  # worker 2 started again
    assert first.row(0, 1) == [4, 0, 0]
    assert not first.slot_waited_for(1)


def test_parked_tasks_by_kind(pair: tuple[Counts, Counts]) -> None:
    first, second = pair
    second.park(7, 1, WRITERS)
    first.park(7, 1, WAITERS)
    assert first.parked_elsewhere(7) == [2] and second.parked_elsewhere(7) == [0]
    assert first.writers_elsewhere(7) == [2] and second.writers_elsewhere(7) == []
    assert not first.slot_waited_for(7), "a waiter for a lock waits for no slot"
    second.park(7, -1, WRITERS)
    assert first.parked_elsewhere(7) == [] and first.writers_elsewhere(7) == []


def test_the_next_slot_waiter_is_found_in_turn(pair: tuple[Counts, Counts]) -> None:
    first, second = pair
    assert first.next_slot_waiter(3, 1) is None
    first.park(3, 1, SLOTS)
    second.park(3, 1, SLOTS)
    assert first.next_slot_waiter(3, 1) == 2
    assert first.next_slot_waiter(3, 3) == 0, "past the last worker, the turn wraps"
    assert first.slot_waited_for(3)


def test_intent_and_lease_marks(pair: tuple[Counts, Counts]) -> None:
    first, second = pair
    second.intent(2, True)
    assert first.writer_intends(2) and not first.writer_intends(1)
    second.intent(2, False)
    assert not first.writer_intends(2)
    first.leased(2, True)
    assert second.parked_elsewhere(2, LEASED) == [0], "a waiter for a slot wakes the leasers"
    first.leased(2, False)
    assert second.parked_elsewhere(2, LEASED) == []
