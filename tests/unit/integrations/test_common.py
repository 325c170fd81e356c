"""What every trainer adapter shares: no silent zero rewards, the text of content parts."""

from __future__ import annotations

import pytest

from grm_service.integrations import common
from grm_service.wire import ItemResult


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


def test_endpoint_timeout_and_retries_reach_the_client() -> None:
    where = common.endpoint("http://x", timeout=7.5, retries=0)
    client = where.client()
    assert client.retry.attempts == 1 and client._http.timeout.read == 7.5
    client.close()
    for bad in ({"timeout": 0}, {"retries": -1}, {"retries": 1.5}):
        with pytest.raises(common.ScoringError, match=next(iter(bad))):
            common.endpoint("http://x", **bad)  # type: ignore[arg-type]


def test_the_key_comes_from_the_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRM_API_KEY", "default-key")
    monkeypatch.setenv("TEAM_GRM_KEY", "team-key")
    assert common.endpoint("http://x").api_key == "default-key"
    assert common.endpoint("http://x", api_key_env="TEAM_GRM_KEY").api_key == "team-key"
    with pytest.raises(common.ScoringError, match="printed and logged"):
        common.no_key_in_config("k", "verl")
