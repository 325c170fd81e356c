from __future__ import annotations

import asyncio
import time

import pytest

from grm_service.config import SerializeMode, Settings
from grm_service.engines import Capabilities
from grm_service.errors import ServiceUnavailable, StreamingUnsupported, UnknownModel
from grm_service.gateway.request import exchange, proxy, router
from grm_service.gateway.request.alone import must_run_alone, runs_alone
from grm_service.gateway.request.context import POOLING_PATHS, ForwardContext, RequestSettings
from grm_service.gateway.request.proxy import prepare
from grm_service.gateway.request.upstream import Upstream
from grm_service.metrics import Metrics
from grm_service.replicas.identity import ServiceIdentity
from grm_service.replicas.pool import Replica, ReplicaPool, ReplicaState

SETTINGS = Settings(model="/models/m", served_model_name="rm", seed=7, max_tokens_default=99)
PATH = RequestSettings.of(SETTINGS)


MSGS = [{"role": "user", "content": "hi"}]


def test_prepare_injects_max_tokens_and_model() -> None:
    body = prepare({"messages": MSGS}, PATH)
    assert body == {"messages": MSGS, "max_tokens": 99, "model": "rm"}


def test_prepare_keeps_client_values() -> None:
    given = {"messages": MSGS, "seed": 0, "max_tokens": 5, "model": "rm", "top_p": 0.8}
    assert prepare(given, PATH) == given
    assert "max_tokens" not in prepare({"messages": MSGS, "max_completion_tokens": 3}, PATH)


def test_prepare_refuses_streaming_and_unknown_models() -> None:
    with pytest.raises(StreamingUnsupported, match="stream=false"):
        prepare({"messages": MSGS, "stream": True}, PATH)
    with pytest.raises(UnknownModel, match="'rm'"):
        prepare({"messages": MSGS, "model": "other"}, PATH)
    assert "stream" not in prepare({"messages": MSGS, "stream": False}, PATH)


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


def test_route_skips_open_breakers_unless_all_are_open() -> None:
    pool = ReplicaPool([Replica(n, "u", state=ReplicaState.READY) for n in ("r0", "r1")])
    pool.replicas[0].open_until = time.monotonic() + 60
    assert [r.name for r in router.route(pool, 123, False)] == ["r1"]
    assert [r.name for r in router.route(pool, 123, False, pin="r0")] == ["r0"], "a pin wins"
    pool.replicas[1].open_until = time.monotonic() + 60
    assert {r.name for r in router.route(pool, 123, False)} == {"r0", "r1"}


def test_no_ready_replica_is_refused_with_each_replicas_state() -> None:
    pool = ReplicaPool([Replica("r0", "u", state=ReplicaState.DOWN)])
    fc = ForwardContext(settings=SETTINGS, pool=pool, client=Upstream(1.0), metrics=Metrics(),
                        identity=ServiceIdentity(SETTINGS))
    with pytest.raises(ServiceUnavailable, match="no healthy replica \\(r0 down\\)"):
        proxy._order(fc, 7, None)


# A request that waited for a slot on a replica which went down meanwhile fails over instead
# of being sent.
async def test_a_request_waiting_on_a_replica_that_went_down_fails_over() -> None:
    replica = Replica("r0", "http://127.0.0.1:9", state=ReplicaState.READY)
    settings = Settings(model="/models/m", queue_timeout_s=5)
    gw = ForwardContext(settings=settings, pool=ReplicaPool([replica]), client=Upstream(5.0),
                        metrics=Metrics(), identity=ServiceIdentity(settings))
    assert exchange._slot_now(gw, replica, True, False)  # the request in flight holds it
    waiting = asyncio.create_task(exchange._wait_for_slot(gw, replica, True, False))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    replica.state = ReplicaState.DOWN  # the keeper saw it die
    await replica.gate.release(True)  # the request in flight failed
    with pytest.raises(exchange.Retryable, match="went down while the request waited"):
        await waiting
    assert replica.gate.inflight == 0 and gw.queued == 0


@pytest.mark.parametrize(("path", "batched", "caps", "alone"), [
    ("/v1/embeddings", False, BI, True),  # pooling never measured: alone even where chat is not
    ("/v1/embeddings", True, BI, True),  # a canary pass counts only where the profile claims
    ("/v1/embeddings", True, Capabilities(True, True, "", pooling_invariant=True), False),
    ("/classify", False, BI, True),
    ("/v1/chat/completions", False, BI, False),
])
def test_embeddings_are_pooling_and_run_alone_unless_proven(
        path: str, batched: bool, caps: Capabilities, alone: bool) -> None:
    replica = Replica("r0", "http://r0", state=ReplicaState.READY)
    replica.pooling_batched = batched
    pooling = path in POOLING_PATHS
    generative_alone = not pooling and must_run_alone({"temperature": 0}, caps,
                                                      SerializeMode.AUTO)
    assert runs_alone(replica, pooling, generative_alone, caps, SerializeMode.AUTO) is alone
