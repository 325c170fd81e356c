from __future__ import annotations

from typing import Any

import pytest

from grm_service.errors import InvalidRequest
from grm_service.scoring.groups.pairwise import PairOptions, check_options, pairs, verdict_points
from grm_service.scoring.registry import check_option_set
from tests.support.groups import PAIRWISE_HEX, HashSend
from tests.support.scoring import FakeBackend, request
from tests.unit.scoring.groups.test_flow import run_groups


def test_circular_and_all_pairs_comparisons_in_their_fixed_order() -> None:
    assert pairs(1, "circular", False) == []
    assert pairs(2, "circular", False) == [(0, 1)]
    assert pairs(4, "circular", False) == [(0, 1), (0, 3), (1, 2), (2, 3)]
    assert pairs(4, "all_pairs", False) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert pairs(3, "circular", True) == [(0, 1), (1, 0), (0, 2), (2, 0), (1, 2), (2, 1)]
    assert len(pairs(16, "all_pairs", False)) == 16 * 15 // 2


@pytest.mark.parametrize(("text", "points"), [
    ("Verdict: A", 1.0), ("verdict = b", 0.0), ("Verdict: TIE", 0.5),
    ("Verdict: B ... so, Verdict: A", 1.0),  # the last verdict counts
    ("Verdict: **A**", 1.0),
])
def test_verdicts_become_the_first_candidates_points(text: str, points: float) -> None:
    assert verdict_points(text, PairOptions.parse({})) == points


def test_an_answer_without_a_known_verdict_is_a_value_error() -> None:
    opts = PairOptions.parse({"pattern": r"V: (\w+)"})
    with pytest.raises(ValueError, match="no verdict"):
        verdict_points("nothing", opts)
    with pytest.raises(ValueError, match="none of a, b, tie"):
        verdict_points("V: maybe", opts)


@pytest.mark.parametrize(("options", "message"), [
    ({"strategy": "swiss"}, "strategy must be one of circular, all_pairs"),
    ({"both_orders": "yes"}, "both_orders must be true or false"),
    ({"verdicts": {}}, "verdicts must map"), ({"verdicts": {"A": 2}}, r"points are in \[0, 1\]"),
    ({"verdicts": {"A": 1, "a": 0}}, "twice"), ({"verdicts": {"A": "1"}}, "finite number"),
    ({"template": "{completion}"}, "only {prompt}, {reference}, {first}, {second}"),
    ({"template": "{first}{first}"}, "2 times"), ({"pattern": "("}, "RE2"),
    ({"min": 1}, "unknown min"),
])
def test_bad_pairwise_options_are_invalid_requests(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        check_options(options)
    with pytest.raises(InvalidRequest, match=message):
        check_option_set("pairwise", options)  # as the registry (and presets) check them


async def test_wins_ties_and_losses_make_a_mean_and_a_lone_content_gets_half() -> None:
    items = [{"id": "x", "prompt": "p", "completion": "one"},
             {"id": "y", "prompt": "p", "completion": "two"}]
    tie = await run_groups(request("pairwise", items), FakeBackend("Verdict: tie"))
    assert [r.score for r in tie.results] == [0.5, 0.5]
    won = await run_groups(request("pairwise", items), FakeBackend("Verdict: A"))
    assert sorted(r.score or 0.0 for r in won.results) == [0.0, 1.0]
    same = [{"id": "x", "prompt": "p", "completion": "one"},
            {"id": "y", "prompt": "p", "completion": "one"}]
    backend = FakeBackend("Verdict: A")
    alone = await run_groups(request("pairwise", same), backend)
    assert [r.score for r in alone.results] == [0.5, 0.5] and backend.calls == []


async def test_a_failed_comparison_fails_its_items_and_says_why() -> None:
    items = [{"id": str(n), "prompt": "p", "completion": f"c{n}"} for n in range(3)]
    answer = await run_groups(request("pairwise", items), FakeBackend("no idea"))
    assert {r.status for r in answer.results} == {"error"}
    assert all("no verdict" in (r.error or "") for r in answer.results)
    assert all(r.score is None and r.fingerprint is not None for r in answer.results)


async def test_each_comparison_carries_its_derived_seed_and_every_response_is_kept() -> None:
    items = [{"id": str(n), "prompt": "p", "completion": f"c{n}"} for n in range(4)]
    send = HashSend()
    answer = await run_groups(request("pairwise", items, options={
        **PAIRWISE_HEX, "strategy": "all_pairs", "both_orders": True}), send)
    assert len(send.bodies) == 12 and len({b["seed"] for b in send.bodies}) == 12
    for r in answer.results:
        assert isinstance(r.response, list) and len(r.response) == 6  # 3 rivals, both orders
        assert r.fingerprint is not None and r.status == "ok"
