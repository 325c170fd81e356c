from __future__ import annotations

import json

import pytest

from grm_service.errors import InvalidRequest
from grm_service.scoring import reward_head
from grm_service.scoring.context import CLASSIFY_PATH
from tests.support.scoring import FakeBackend, data_url, request, run


async def test_raw_head_value_of_image_and_prompt() -> None:
    backend = FakeBackend(probs=[-1.5, 0.25])
    items = [{"id": "a", "image": data_url(), "prompt": "a red fox"}]
    answer = await run(request("reward_head", items), backend)
    result = answer.results[0]
    assert result.status == "ok" and result.score == -1.5
    assert result.response == json.dumps([-1.5, 0.25])
    path, body = backend.calls[0]
    assert path == CLASSIFY_PATH and body["use_activation"] is False
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url()}},
        {"type": "text", "text": "a red fox"}]}]


async def test_options_template_label_scale_and_hpsv3_head() -> None:
    backend = FakeBackend(probs=[2.0, 0.5])
    items = [{"id": "a", "image": data_url(), "prompt": "fox"}]
    options = {"template": "Prompt - {prompt}. Rate it:", "label": -1, "scale": 4}
    answer = await run(request("reward_head", items, options=options), backend)
    assert answer.results[0].score == 2.0
    assert backend.calls[0][1]["messages"][0]["content"][1]["text"] == "Prompt - fox. Rate it:"
    hpsv3 = await run(request("reward_head", items, options={"head": "hpsv3"}), backend)
    assert hpsv3.results[0].score == 2.0
    wide = await run(request("reward_head", items, options={"head": "hpsv3"}),
                     FakeBackend(probs=[1.0]))
    assert "two outputs (mu, sigma)" in str(wide.results[0].error)
    out = await run(request("reward_head", items, options={"label": 5}), backend)
    assert "label 5 is out of range" in str(out.results[0].error)


async def test_frames_are_averaged_in_order() -> None:
    backend = FakeBackend(probs=[3.0])
    items = [{"id": "v", "image": [data_url("A"), data_url("B")], "prompt": "p"}]
    answer = await run(request("reward_head", items), backend)
    assert answer.results[0].score == 3.0 and len(backend.calls) == 2
    assert [c[1]["messages"][0]["content"][0]["image_url"]["url"] for c in backend.calls] == [
        data_url("A"), data_url("B")]


async def test_item_errors_name_what_is_missing() -> None:
    backend = FakeBackend()
    items = [{"id": "a", "prompt": "p"}, {"id": "b", "image": data_url()}]
    answer = await run(request("reward_head", items), backend)
    assert "needs an image" in str(answer.results[0].error)
    assert "needs the item's prompt" in str(answer.results[1].error)
    # A template without {prompt} scores the image alone.
    alone = await run(request("reward_head", items[1:], options={"template": "Rate:"}), backend)
    assert alone.results[0].status == "ok"


@pytest.mark.parametrize(("options", "message"), [
    ({"temperature": 1}, "unknown temperature"),
    ({"template": 3}, "template must be a string"),
    ({"head": "softmax"}, "head must be one of scalar, hpsv3"),
    ({"label": True}, "label must be an integer"),
    ({"scale": "2"}, "scale must be a number"),
])
def test_bad_options_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        reward_head.check_options(options)
