"""Held groups end to end: a group's items sent one per request, concurrently, to a gateway of
two worker processes on STUB replicas (the gateway is under test), are judged once and given
bitwise the rewards the whole group gets in one request; a backlog of one item per slot does
not refuse the samples that complete the waiting groups; a group that never fills answers each
of its items with an error that names it."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
import pytest

from tests.support.groups import PAIRWISE_HEX, group_items
from tests.support.procs import Proc, gateway_on_stubs

ENV = {"GRM_LEDGER_CACHE_SCORE": "false", "GRM_SCORE_ITEMS_PER_SLOT": "1",
       "GRM_GROUP_TIMEOUT_S": "3", "GRM_GROUP_POLL_S": "0.01"}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, stub_pair: list[Proc]) -> Any:
    with gateway_on_stubs(tmp_path_factory.mktemp("held"), "--workers", "2", env=ENV,
                          shared=stub_pair) as (gateway, _):
        yield gateway


def rewards(results: list[dict[str, Any]]) -> dict[str, tuple[str | None, str | None]]:
    return {r["id"]: (None if r["score"] is None else float(r["score"]).hex(), r["error"])
            for r in results}


async def one_by_one(url: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each item in a request of its own, all at once, over fresh connections (so that the
    two workers' sockets both take some)."""

    async def send(item: dict[str, Any]) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            r = await client.post("/v1/score", json={"scorer": "pairwise", "items": [item],
                                                     "options": PAIRWISE_HEX})
        assert r.status_code == 200, r.text
        return dict(r.json()["results"][0])

    return list(await asyncio.gather(*(send(i) for i in items)))


def test_items_sent_one_per_request_get_the_whole_groups_rewards(service: Proc) -> None:
    rng = random.Random(481)
    groups = [[{**i, "id": f"g{size}-{i['id']}"} for i in group_items(size, rng,
                                                                      group_id=f"held{size}")]
              for size in (2, 4, 8)]
    whole = []
    for items in groups:
        r = httpx.post(service.url + "/v1/score", timeout=60, json={
            "scorer": "pairwise", "items": items, "options": PAIRWISE_HEX})
        assert r.status_code == 200, r.text
        whole += r.json()["results"]
    # Every group's items at once, shuffled together: 14 requests where the backlog admits one
    # item per slot; the waiting items owe nothing, so none is refused.
    mixed = [i for items in groups for i in items]
    rng.shuffle(mixed)
    held = asyncio.run(one_by_one(service.url, mixed))
    assert rewards(held) == rewards(whole)
    assert any(r["status"] == "ok" for r in held)


def test_a_group_that_never_fills_gives_each_item_an_error_naming_it(service: Proc) -> None:
    items = group_items(4, random.Random(482), group_id="short")
    got = asyncio.run(one_by_one(service.url, items[:3]))
    assert all(r["status"] == "error" and r["score"] is None for r in got), got
    assert all("short" in r["error"] and "3 of" in r["error"] for r in got), got
