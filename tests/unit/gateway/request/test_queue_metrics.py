"""The queue in front of each replica, as metrics: depth, wait, and 429s by reason; and the
engine's token usage counted from answers."""

from __future__ import annotations

import asyncio

import pytest

from grm_service.config import Settings
from grm_service.errors import Overloaded
from grm_service.gateway.request import exchange
from grm_service.gateway.request.context import ForwardContext
from grm_service.gateway.request.upstream import Upstream
from grm_service.metrics import Metrics
from grm_service.replicas.identity import ServiceIdentity
from grm_service.replicas.pool import Replica, ReplicaPool, ReplicaState


def gateway(**over: float) -> tuple[ForwardContext, Replica]:
    replica = Replica("r0", "http://127.0.0.1:9", state=ReplicaState.READY)
    settings = Settings(model="/models/m", **over)
    gw = ForwardContext(settings=settings, pool=ReplicaPool([replica]), client=Upstream(5.0),
                        metrics=Metrics(), identity=ServiceIdentity(settings))
    return gw, replica


def value(gw: ForwardContext, name: str, **labels: str) -> float:
    found = gw.metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


async def admit(gw: ForwardContext, replica: Replica, owed: bool = False) -> None:
    """A slot for a request run alone, as `exchange.attempt` takes it."""
    if not exchange._slot_now(gw, replica, True, owed):
        await exchange._wait_for_slot(gw, replica, True, owed)


async def test_a_queued_request_is_counted_while_it_waits_and_its_wait_observed() -> None:
    gw, replica = gateway(queue_timeout_s=5)
    assert exchange._slot_now(gw, replica, True, False)  # the only slot: no wait, not observed
    assert value(gw, "grm_queue_wait_seconds_count") == 0
    waiting = asyncio.create_task(admit(gw, replica))
    async with asyncio.timeout(5):
        while not gw.queued:  # the task is in the queue
            await asyncio.sleep(0)
    assert value(gw, "grm_queue_depth") == 1
    await asyncio.sleep(0.05)
    await replica.gate.release(True)
    await waiting
    assert value(gw, "grm_queue_depth") == 0
    assert value(gw, "grm_queue_wait_seconds_count") == 1
    assert value(gw, "grm_queue_wait_seconds_sum") >= 0.04


@pytest.mark.parametrize(("over", "reason", "setting"), [
    ({"max_queue": 0}, "queue_full", "GRM_MAX_QUEUE=0"),
    ({"queue_timeout_s": 0.05}, "queue_timeout", "GRM_QUEUE_TIMEOUT_S=0.05 s"),
])
async def test_each_429_is_counted_by_its_reason_and_names_its_setting(
    over: dict[str, float], reason: str, setting: str
) -> None:
    gw, replica = gateway(**over)
    replica.gate.try_acquire(True)  # the replica is busy
    with pytest.raises(Overloaded) as refused:
        await admit(gw, replica)
    assert value(gw, "grm_rejected_total", reason=reason) == 1
    assert value(gw, "grm_queue_depth") == 0
    assert setting in refused.value.message and "raise" in refused.value.message


async def test_an_admitted_score_item_waits_past_the_queue_timeout_and_a_full_queue() -> None:
    gw, replica = gateway(queue_timeout_s=0.05, max_queue=0)
    replica.gate.try_acquire(True)  # the replica is busy for longer than the queue timeout
    waiting = asyncio.create_task(admit(gw, replica, owed=True))
    await asyncio.sleep(0.2)
    assert not waiting.done() and gw.queued == 1
    await replica.gate.release(True)
    async with asyncio.timeout(5):
        await waiting  # its slot, not a 429
    assert value(gw, "grm_rejected_total", reason="queue_timeout") == 0


def test_tokens_are_counted_from_the_engines_usage() -> None:
    gw, _ = gateway()
    count = gw.meters.count_tokens
    count({"usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})
    count({"usage": {"prompt_tokens": 2}})
    count({"data": []})  # a route without usage: nothing counted, nothing raised
    count({"usage": {"prompt_tokens": "x"}})
    assert value(gw, "grm_tokens_total", kind="prompt") == 9
    assert value(gw, "grm_tokens_total", kind="completion") == 3


def test_latency_buckets_reach_the_request_timeout() -> None:
    metrics = Metrics()
    metrics.latency.labels(route="/v1/score").observe(500)
    timeout = Settings(model="/models/m").request_timeout_s
    below = metrics.registry.get_sample_value(
        "grm_request_duration_seconds_bucket", {"route": "/v1/score", "le": str(timeout)})
    assert below == 1  # a 500 s request lands below the timeout, not only in +Inf
