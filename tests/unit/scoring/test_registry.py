from __future__ import annotations

import pytest

from grm_service.errors import (
    ConfigError,
    UnknownScorer,
)
from grm_service.scoring.registry import lookup, parse_spec
from tests.support.scoring import FakeBackend, request, run


async def test_custom_scorers_sync_async_and_failing() -> None:
    items = [{"id": "a", "completion": "4", "reference": "4"}]
    assert (await run(request("rule", items), FakeBackend())).results[0].score == 1.0
    length = await run(request("length", items), FakeBackend("abc"))
    assert length.results[0].score == pytest.approx(0.3)
    assert length.results[0].response == "abc"
    broken = await run(request("broken", items), FakeBackend())
    assert broken.results[0].error == "scorer broken raised ZeroDivisionError: boom"


def test_unknown_scorer_and_bad_specs() -> None:
    with pytest.raises(UnknownScorer,
                       match="registered: classify, clip, judge, listwise, ocr, pairwise"):
        lookup("nope")
    with pytest.raises(ConfigError, match="NAME=module:function"):
        parse_spec("justaname")
    with pytest.raises(ConfigError, match="cannot load"):
        lookup("x", ("x=tests.support.scoring:missing",))
