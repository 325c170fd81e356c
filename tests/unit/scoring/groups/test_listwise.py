from __future__ import annotations

from typing import Any

import pytest

from grm_service.errors import InvalidRequest
from grm_service.scoring.groups.listwise import ListOptions, check_options, scores
from tests.support.scoring import FakeBackend, request
from tests.unit.scoring.groups.test_flow import run_groups


def test_scores_by_candidate_number_the_last_one_counts() -> None:
    opts = ListOptions.parse({})
    text = "Response 1: 3\nResponse 2: 9\nResponse 7: 1\nActually, Response 1: 4"
    assert scores(text, 3, opts) == {1: "4", 2: "9"}


@pytest.mark.parametrize(("options", "message"), [
    ({"pattern": r"Score: (\d+)"}, "two groups"), ({"min": 3, "max": 2}, "range is empty"),
    ({"template": "{completion}"}, "only {prompt}, {reference}, {candidates}"),
    ({"template": "{candidates}{candidates}"}, "2 times"), ({"strategy": "x"}, "unknown"),
])
def test_bad_listwise_options_are_invalid_requests(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        check_options(options)


async def test_one_prompt_lists_the_group_and_a_candidate_without_a_score_is_an_error() -> None:
    items = [{"id": str(n), "prompt": "p", "completion": f"c{n}"} for n in range(3)]
    backend = FakeBackend("Response 1: 10\nResponse 2: 1\nResponse 3: 11")
    answer = await run_groups(request("listwise", items), backend)
    assert len(backend.calls) == 1
    prompt = backend.calls[0][1]["messages"][0]["content"]
    assert all(f"c{n}" in prompt for n in range(3)) and "Rate each of the 3 responses" in prompt
    by_score = sorted(r.score for r in answer.results if r.status == "ok")
    assert by_score == [0.0, 1.0]
    bad = [r for r in answer.results if r.status == "error"]
    assert len(bad) == 1 and "outside [1.0, 10.0]" in (bad[0].error or "")
    assert bad[0].score is None and bad[0].response == [backend.answer]
