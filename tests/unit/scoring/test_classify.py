from __future__ import annotations

import pytest

from grm_service.scoring.context import CLASSIFY_PATH
from tests.support.scoring import FakeBackend, request, run


async def test_classify_uses_last_label_and_raw_output() -> None:
    backend = FakeBackend(probs=[0.1, 0.7])
    items = [{"id": "a", "prompt": "q", "completion": "a"}]
    answer = await run(request("classify", items), backend)
    assert answer.results[0].score == pytest.approx(0.7)
    path, body = backend.calls[0]
    assert path == CLASSIFY_PATH and body["use_activation"] is True
    assert body["messages"] == [{"role": "user", "content": "q"},
                                {"role": "assistant", "content": "a"}]
    await run(request("classify", items, options={"output": "raw"}), backend)
    assert backend.calls[1][1]["use_activation"] is False
    missing = await run(request("classify", [{"id": "b", "prompt": "q"}]), backend)
    assert "needs `completion`" in str(missing.results[0].error)
