from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grm_service.errors import InvalidRequest
from grm_service.scoring.groups.flow import Groups, check_groups, score_groups
from grm_service.scoring.groups.seam import Judge
from grm_service.scoring.models import ItemResult, ScoreItem, ScoreRequest, ScoreResponse
from grm_service.scoring.registry import GROUP
from tests.support.groups import LISTWISE_HEX, PAIRWISE_HEX, HashSend, group_items
from tests.support.scoring import data_url, request


async def run_groups(req: ScoreRequest, send: Any, concurrency: int = 8,
                     holder: Any = None, seed: int = 42) -> ScoreResponse:
    groups = Groups(send=send, concurrency=concurrency, service_seed=seed, holder=holder)
    return await score_groups(req, GROUP[req.scorer], groups, "grm-test")


def by_id(answer: ScoreResponse) -> dict[str, tuple[str | None, str | None, str]]:
    """Each item's reward (its float's bits, as hex), error and digest (which covers its
    fingerprint's digests)."""
    return {r.id: (None if r.score is None else r.score.hex(), r.error, r.digest)
            for r in sorted(answer.results, key=lambda r: r.id)}


CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("pairwise", PAIRWISE_HEX),
    ("pairwise", {**PAIRWISE_HEX, "strategy": "all_pairs", "both_orders": True}),
    ("listwise", LISTWISE_HEX),
]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.integers(2, 9), config=st.sampled_from(CONFIGS), data=st.data(),
       concurrency=st.sampled_from([1, 3, 64]))
async def test_any_permutation_and_concurrency_give_the_same_rewards_bitwise(
    size: int, config: tuple[str, dict[str, Any]], data: st.DataObject, concurrency: int
) -> None:
    scorer, options = config
    items = group_items(size, random.Random(size))
    items.append({**items[0], "id": "twin"})  # an identical completion: the same reward
    shuffled = data.draw(st.permutations(items))
    first = await run_groups(request(scorer, items, options=options), HashSend())
    again = await run_groups(request(scorer, shuffled, options=options), HashSend(),
                             concurrency=concurrency)
    assert [r.id for r in again.results] == [i["id"] for i in shuffled]  # input order
    assert by_id(first) == by_id(again)
    assert first.fingerprint.digest != again.fingerprint.digest or items == shuffled
    twin, original = by_id(first)["twin"], by_id(first)["c0"]
    assert twin[:2] == original[:2]


async def test_rewards_hang_on_the_bytes_judged_so_the_invariance_test_can_fail() -> None:
    items = group_items(6, random.Random(1))
    base = by_id(await run_groups(request("pairwise", items, options=PAIRWISE_HEX), HashSend()))
    other_seed = by_id(await run_groups(request("pairwise", items, options=PAIRWISE_HEX),
                                        HashSend(), seed=7))
    assert {k: v[0] for k, v in base.items()} != {k: v[0] for k, v in other_seed.items()}
    assert len({v[0] for v in base.values()}) > 1


async def test_a_sampling_seed_is_the_base_of_the_comparison_seeds() -> None:
    items = group_items(3, random.Random(2))
    sent, given_seed = HashSend(), HashSend()
    await run_groups(request("pairwise", items, options=PAIRWISE_HEX), sent)
    await run_groups(request("pairwise", items, options=PAIRWISE_HEX, sampling={"seed": 9}),
                     given_seed)
    assert {b["seed"] for b in sent.bodies}.isdisjoint(b["seed"] for b in given_seed.bodies)
    assert 9 not in {b["seed"] for b in given_seed.bodies}


async def test_groups_by_group_id_and_the_rest_as_one_group() -> None:
    rng = random.Random(3)
    items = [*group_items(2, rng, "g1"), *group_items(3, rng, "g2")]
    items = [{**item, "id": f"{item['group_id']}-{item['id']}"} for item in items]
    loose = [{**i, "id": f"loose-{i['id']}"} for i in group_items(2, rng)]
    send = HashSend()
    answer = await run_groups(request("listwise", [*items, *loose], options=LISTWISE_HEX), send)
    assert len(send.bodies) == 3  # one prompt per group
    assert [r.id for r in answer.results] == [i["id"] for i in [*items, *loose]]
    assert sorted(b["messages"][0]["content"].count("Response ") for b in send.bodies) == [
        2 + 1, 2 + 1, 3 + 1]  # each list, and the template's closing line


@pytest.mark.parametrize(("items", "message"), [
    ([{"id": "a", "group_id": "g", "group_size": 2}, {"id": "b", "group_id": "g",
                                                      "group_size": 3}], "different group_size"),
    ([{"id": "a", "group_id": "g", "group_size": 1}, {"id": "b", "group_id": "g"}],
     "2 items here but group_size 1"),
    ([{"id": "a", "group_size": 3}], "give them a group_id"),
    ([{"id": "a", "group_id": "g", "group_size": 65}], "GRM_GROUP_MAX_SIZE"),
    ([{"id": str(n)} for n in range(65)], "the limit is 64"),
])
def test_inconsistent_or_oversized_groups_are_invalid_requests(
    items: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message):
        check_groups([ScoreItem.model_validate(i) for i in items], 64)


async def test_an_incomplete_group_without_a_holder_is_each_items_error() -> None:
    items = group_items(2, random.Random(4), "g")
    items = [{**i, "group_size": 4} for i in items]
    answer = await run_groups(request("pairwise", items), HashSend())
    assert all(r.status == "error" and "has 2 of its 4 items" in (r.error or "")
               and "send all of a group's items in one request" in (r.error or "")
               for r in answer.results)


class OneShotHolder:
    """A holder that has already seen the rest of the group: it judges the members with
    `others` (its stand-in for the other requests' items)."""

    def __init__(self, others: list[ScoreItem]) -> None:
        self.others, self.calls = others, []  # type: ignore[var-annotated]

    async def score_held(self, group: str, size: int, members: list[ScoreItem],
                         judge: Judge) -> dict[str, ItemResult]:
        self.calls.append((group, size))
        judged = await judge([*members, *self.others])
        return {m.id: judged[m.id] for m in members}


async def test_an_incomplete_group_goes_to_the_holder_and_is_judged_as_a_whole() -> None:
    whole = group_items(4, random.Random(5), "g")
    complete = await run_groups(request("pairwise", whole, options=PAIRWISE_HEX), HashSend())
    holder = OneShotHolder([ScoreItem.model_validate(i) for i in whole[2:]])
    part = await run_groups(request("pairwise", whole[:2], options=PAIRWISE_HEX), HashSend(),
                            holder=holder)
    assert len(holder.calls) == 1 and holder.calls[0][1] == 4
    assert by_id(part) == {k: v for k, v in by_id(complete).items() if k in ("c0", "c1")}


async def test_different_prompts_in_a_group_and_bad_images_are_item_errors() -> None:
    mixed = [{"id": "a", "prompt": "p", "completion": "x"},
             {"id": "b", "prompt": "q", "completion": "y"}]
    answer = await run_groups(request("pairwise", mixed), HashSend())
    assert all("different prompts" in (r.error or "") for r in answer.results)
    images = [{"id": "a", "prompt": "p", "image": data_url("A")},
              {"id": "b", "prompt": "p", "image": "http://example.com/x.png"},
              {"id": "c", "prompt": "p", "image": data_url("C")}]
    send = HashSend()
    shown = await run_groups(request("pairwise", images, options=PAIRWISE_HEX), send)
    assert "must be inline" in (shown.results[1].error or "")
    assert shown.results[0].status == shown.results[2].status == "ok"
    parts = send.bodies[0]["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "text", "image_url", "text"]
