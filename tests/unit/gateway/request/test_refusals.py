"""Refusals are counted one by one and logged at most once per reason and interval."""

from __future__ import annotations

import logging

import pytest

from grm_service.errors import Overloaded
from grm_service.gateway.request.refusals import Refusals
from grm_service.metrics import Metrics


def test_each_refusal_is_counted_and_each_reason_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics, now = Metrics(), [0.0]
    refusals = Refusals(metrics.rejected, interval_s=10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, "grm_service.gateway.request.refusals")
    for _ in range(34):  # a burst of one reason: one line
        refusals.note("queue_timeout", 429, "no slot within GRM_QUEUE_TIMEOUT_S=30 s")
        now[0] += 0.1
    refusals.note("draining", 503, "shutting down")  # another reason: its own line
    now[0] += 10.0
    err = refusals.refuse("queue_timeout", Overloaded("no slot within GRM_QUEUE_TIMEOUT_S=30 s"))
    assert isinstance(err, Overloaded)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "refused 429 (queue_timeout): no slot within GRM_QUEUE_TIMEOUT_S=30 s",
        "refused 503 (draining): shutting down",
        "refused 429 (queue_timeout): no slot within GRM_QUEUE_TIMEOUT_S=30 s "
        "(34 refusals of this reason since the last line)",
    ]
    count = metrics.registry.get_sample_value
    assert count("grm_rejected_total", {"reason": "queue_timeout"}) == 35
    assert count("grm_rejected_total", {"reason": "draining"}) == 1
