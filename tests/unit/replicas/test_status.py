"""The keeper's view of each replica as gauges: state, last error (one bounded line)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from grm_service.config import Settings
from grm_service.metrics import ERROR_LABEL_CHARS, Metrics
from grm_service.replicas.pool import ReplicaState
from grm_service.replicas.status import ReplicaStatus, error_label
from tests.support.gateway import serving


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_error_label_keeps_the_first_and_the_last_line_bounded() -> None:
    assert error_label("replica r0 health check: refused") == "replica r0 health check: refused"
    tail = "replica r0 exited (1); last lines:\n(log /x/replica.log)\n\nOSError: no model at /m\n"
    assert error_label(tail) == "replica r0 exited (1); last lines: ... OSError: no model at /m"
    assert len(error_label("x" * 1000)) == ERROR_LABEL_CHARS
    assert error_label(" \n ") == "unknown"


def test_state_is_one_for_the_current_state_only() -> None:
    metrics = Metrics()
    status = ReplicaStatus(metrics)
    status.state("r0", ReplicaState.DOWN)
    status.state("r0", ReplicaState.READY)
    values = {s.value: sample(metrics, "grm_replica_state", replica="r0", state=s.value)
              for s in ReplicaState}
    assert values == {s.value: float(s is ReplicaState.READY) for s in ReplicaState}
    assert sample(metrics, "grm_replica_up", replica="r0") == 1


def test_the_last_error_is_one_and_the_one_it_replaced_zero() -> None:
    metrics = Metrics()
    status = ReplicaStatus(metrics)
    status.start_failed("r0", "replica r0 health check: refused")
    status.start_failed("r0", "replica r0 health check: refused")
    status.error("r0", "failed 3 health checks in a row")
    assert sample(metrics, "grm_replica_last_error", replica="r0",
                  error="replica r0 health check: refused") == 0
    assert sample(metrics, "grm_replica_last_error", replica="r0",
                  error="failed 3 health checks in a row") == 1
    assert sample(metrics, "grm_replica_start_failures_total", replica="r0") == 2


async def test_a_replica_that_cannot_start_shows_in_the_gateways_metrics(tmp_path: Path) -> None:
    """What the dashboard reads while nothing listens at an attached replica's address."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    settings = Settings(replica_urls=[url], served_model_name="rm", work_dir=tmp_path,
                        health_interval_s=0.05)
    async with serving(settings, ready=False) as (_, gw):
        async with asyncio.timeout(10):
            while (sample(gw.metrics, "grm_replica_start_failures_total", replica="r0") or 0) < 2:
                await asyncio.sleep(0.02)
        assert sample(gw.metrics, "grm_replica_state", replica="r0", state="down") == 1
        assert sample(gw.metrics, "grm_replica_up", replica="r0") == 0
        assert sample(gw.metrics, "grm_replica_last_error", replica="r0",
                      error="replica r0 health check: refused") == 1
