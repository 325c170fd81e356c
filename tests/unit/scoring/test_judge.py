from __future__ import annotations

from typing import Any

import pytest

from grm_service.errors import (
    InvalidRequest,
)
from grm_service.scoring.context import ItemError
from grm_service.scoring.judge import JudgeOptions, parse_score, render
from grm_service.scoring.models import ScoreItem
from tests.support.scoring import FakeBackend, request, run


async def test_judge_scores_and_unparsable_answers_error() -> None:
    ok = await run(request("judge", [{"id": "a", "prompt": "2+2", "completion": "4"}]),
                   FakeBackend("It is right.\nScore: 8"))
    assert ok.results[0].score == pytest.approx(7 / 9)
    bad = await run(request("judge", [{"id": "a", "completion": "4"}]), FakeBackend("great"))
    assert bad.results[0].status == "error" and "no score matching" in str(bad.results[0].error)


@pytest.mark.parametrize(
    ("text", "options", "expected"),
    [
        ("Score: 10", {}, 1.0),
        ("score=1", {}, 0.0),
        ("Score: 3 ... final Score: 5.5", {}, 0.5),  # the last verdict counts
        ("[[7]]", {"pattern": r"\[\[(\d+)\]\]", "min": 0, "max": 10}, 0.7),
        ("0.25", {"pattern": r"([01](?:\.\d+)?)", "min": 0, "max": 1}, 0.25),
    ],
)
def test_parse_score(text: str, options: dict[str, Any], expected: float) -> None:
    assert parse_score(text, JudgeOptions.parse(options)) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "options", "message"),
    [("Score: 11", {}, "outside"), ("nothing", {}, "no score"),
     ("x", {"pattern": "Score: 1"}, "no score")],
)
def test_parse_score_errors(text: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ItemError, match=message):
        parse_score(text, JudgeOptions.parse(options))


@pytest.mark.parametrize(
    ("options", "message"),
    [({"min": 5, "max": 5}, "empty"), ({"pattern": "("}, "not accepted by RE2"),
     ({"pattern": r"(a)\1"}, "backreferences"), ({"pattern": 7}, "must be a string"),
     ({"min": "1"}, "finite number"), ({"max": float("nan")}, "finite number"),
     ({"template": "{prompt:>100000000}"}, "format specs"),
     ({"template": "{prompt.__class__}"}, "attribute access"),
     ({"template": "{prompt!r}"}, "conversions"), ({"template": "{0}"}, "only"),
     ({"template": "{prompt}{prompt}"}, "2 times"), ({"template": "{"}, "cannot be parsed"),
     ({"template": "x" * 20000}, "the limit is"), ({"temperature": 1}, "unknown temperature")],
)
def test_bad_judge_options_are_invalid_requests(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        JudgeOptions.parse(options)


def test_catastrophic_pattern_runs_in_linear_time() -> None:
    opts = JudgeOptions.parse({"pattern": r"(?:\w|\w|\w)+!(\d)"})
    # Python's `re` would take 3**n steps here; RE2 is linear, so this returns at once.
    with pytest.raises(ItemError, match="no score"):
        parse_score("a" * 50_000, opts)


def test_template_is_filled_by_plain_substitution() -> None:
    opts = JudgeOptions.parse({"template": "{{literal}} {min}-{max}: {prompt} / {completion}"})
    item = ScoreItem(id="a", prompt="{max}", completion="{prompt.__class__}")
    assert render(item, opts) == "{literal} 1-10: {max} / {prompt.__class__}"
