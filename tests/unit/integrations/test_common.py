"""What every trainer adapter shares: no silent zero rewards, the text of content parts."""

from __future__ import annotations

import pytest

from grm_service.integrations import common
from grm_service.scoring.models import ItemResult


def result(score: float | None, status: str = "ok") -> ItemResult:
    return ItemResult(id="0", score=score, status=status,  # type: ignore[arg-type]
                      error=None if status == "ok" else "bad", digest="d")


def test_reward_or_refuses_silent_zeros() -> None:
    assert common.reward_or(result(0.5), None) == 0.5
    assert common.reward_or(result(None, "error"), -1.0) == -1.0
    with pytest.raises(common.ScoringError, match="error_score"):
        common.reward_or(result(None, "error"), None)


def test_text_of_content_parts() -> None:
    parts = [{"type": "image"}, {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert common.text_of([{"role": "user", "content": parts}]) == "ab"
