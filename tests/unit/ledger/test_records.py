"""Origin.of: who asked and under which tags, kept once made."""

from __future__ import annotations

import pytest

from grm_service.errors import BadTag
from grm_service.ledger.records import Origin, key_id


def test_an_origin_is_the_keys_digest_and_the_parsed_tags() -> None:
    origin = Origin.of("/v1/score", b"sk-one", "run-a", "12")
    assert origin == Origin("/v1/score", key_id(b"sk-one"), "run-a", 12)
    assert origin.key_id.startswith("key-") and "sk-one" not in origin.key_id
    assert Origin.of("/v1/score", None, "", "") == Origin("/v1/score", "", None, None)


def test_a_repeated_origin_is_the_one_made_before() -> None:
    first = Origin.of("/v1/chat/completions", b"sk-two", "run-b", "3")
    assert Origin.of("/v1/chat/completions", b"sk-two", "run-b", "3") is first
    other = Origin.of("/v1/chat/completions", b"sk-three", "run-b", "3")
    assert other.key_id != first.key_id
    assert Origin.of("/v1/chat/completions", b"sk-two", "run-b", "4").step == 4


@pytest.mark.parametrize(("run", "step"), [("run\n", "1"), ("run", "-1"), ("run", "x")])
def test_a_bad_tag_is_refused_each_time_it_is_sent(run: str, step: str) -> None:
    for _ in range(2):  # a refusal is not kept as an origin
        with pytest.raises(BadTag):
            Origin.of("/v1/score", None, run, step)
