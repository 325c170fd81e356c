"""The score backlog: which batches are admitted, what a refusal says, and its Retry-After."""

from __future__ import annotations

import pytest

from grm_service.errors import Overloaded
from grm_service.gateway.request.backlog import RETRY_AFTER_MAX_S, Backlog


@pytest.mark.parametrize(("owed", "items", "slots", "admitted"), [
    (0, 500, 2, True),  # nothing owed: a lone batch is taken whatever its size
    (4, 4, 2, True),  # 8 of 4 x 2
    (5, 4, 2, False),
    (4, 4, 0, False),  # no ready replica counts as one slot: 8 > 4
    (8, 4, 3, True),
    # Brings nothing to owe (held group items waiting for their group): taken even past the
    # bound, or the first items of a group would be refused while another group is judged.
    (9, 0, 2, True),
])
def test_a_batch_is_admitted_within_items_per_slot_times_slots(
    owed: int, items: int, slots: int, admitted: bool
) -> None:
    backlog = Backlog(items_per_slot=4)
    backlog.owed = owed
    if admitted:
        backlog.check(items, slots)
        return
    with pytest.raises(Overloaded) as refused:
        backlog.check(items, slots)
    assert "GRM_SCORE_ITEMS_PER_SLOT=4" in refused.value.message
    assert refused.value.retry_after is not None and refused.value.retry_after >= 1


def test_owed_items_are_settled_one_by_one_and_the_rest_at_the_batchs_end() -> None:
    backlog = Backlog(items_per_slot=4)
    with backlog.owe(3) as first, backlog.owe(2):
        assert backlog.owed == 5
        first.settle()
        assert backlog.owed == 4
    assert backlog.owed == 0  # the batches ended: their unsettled items too (failed, cancelled)


def test_retry_after_is_the_time_the_excess_takes_at_the_recent_pace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr("grm_service.gateway.request.backlog.time.monotonic", lambda: now[0])
    backlog = Backlog(items_per_slot=1)
    with backlog.owe(4) as debt:
        for _ in range(3):
            now[0] += 2.0  # an item scored every 2 s
            debt.settle()
        with pytest.raises(Overloaded) as refused:
            backlog.check(3, slots=1)  # 1 owed + 3 = 3 past the bound of 1
        assert refused.value.retry_after == 6.0
        with pytest.raises(Overloaded) as refused:
            backlog.check(1000, slots=1)
        assert refused.value.retry_after == RETRY_AFTER_MAX_S
