from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from grm_service.errors import (
    BackendRejected,
    ConfigError,
    InvalidRequest,
    ServiceUnavailable,
    UnknownScorer,
)
from grm_service.scoring.batch import combine, score_batch
from grm_service.scoring.context import CLASSIFY_PATH, ItemError, Reply
from grm_service.scoring.images import to_data_url
from grm_service.scoring.judge import JudgeOptions, parse_score, render
from grm_service.scoring.models import ScoreItem, ScoreRequest
from grm_service.scoring.registry import lookup, parse_spec
from tests.support.scoring import FakeBackend, data_url, fingerprint, png

CUSTOM = ("length=tests.support.scoring:length_score", "rule=tests.support.scoring:rule_score",
          "broken=tests.support.scoring:broken_score")


def request(scorer: str, items: list[dict[str, Any]], **kw: Any) -> ScoreRequest:
    return ScoreRequest.model_validate({"scorer": scorer, "items": items, **kw})


async def run(req: ScoreRequest, send: Any, concurrency: int = 8) -> Any:
    return await score_batch(req, lookup(req.scorer, CUSTOM), send, concurrency, "grm-test")


async def test_ocr_batch_in_order_with_a_bad_image_as_an_error_item() -> None:
    items = [{"id": "good", "image": data_url(), "reference": "HELLO"},
             {"id": "bad", "image": base64.b64encode(b"not an image").decode(), "reference": "x"},
             {"id": "frames", "image": [data_url(), data_url("B")], "reference": "HELLO"}]
    answer = await run(request("ocr", items, sampling={"max_tokens": 8}), FakeBackend("hello"))
    assert [r.id for r in answer.results] == ["good", "bad", "frames"]
    good, bad, frames = answer.results
    assert (good.status, good.score, good.response) == ("ok", 1.0, "hello")
    assert bad.status == "error" and bad.score is None
    assert bad.error == ("image is neither a data URL nor base64 of a PNG, JPEG, WebP, GIF, BMP "
                         "or TIFF")
    assert frames.response == ["hello", "hello"] and frames.score == 1.0
    assert answer.fingerprint.errors == 1 and answer.fingerprint.items == 3


async def test_sampling_overrides_scorer_defaults() -> None:
    backend = FakeBackend("x")
    await run(request("ocr", [{"id": "a", "image": data_url(), "reference": "x"}],
                      sampling={"max_tokens": 8, "temperature": 0}), backend)
    body = backend.calls[0][1]
    assert (body["max_tokens"], body["temperature"], body["top_p"]) == (8, 0, 0.8)


async def test_batch_digest_depends_on_order_not_on_batching() -> None:
    items = [{"id": str(i), "image": data_url(str(i)), "reference": str(i)} for i in range(6)]
    whole = await run(request("ocr", items), FakeBackend("1"))
    halves = [await run(request("ocr", items[:3]), FakeBackend("1")),
              await run(request("ocr", items[3:]), FakeBackend("1"))]
    assert [r.digest for r in whole.results] == [r.digest for h in halves for r in h.results]
    shuffled = await run(request("ocr", items[::-1]), FakeBackend("1"))
    assert shuffled.fingerprint.digest != whole.fingerprint.digest


async def test_concurrency_is_bounded() -> None:
    inflight, peak = 0, 0

    async def slow(path: str, body: dict[str, Any]) -> Reply:
        nonlocal inflight, peak
        inflight += 1
        peak = max(peak, inflight)
        await asyncio.sleep(0.01)
        inflight -= 1
        payload = {"choices": [{"message": {"content": "x"}}]}
        return payload, fingerprint(body, payload)

    items = [{"id": str(i), "image": data_url(), "reference": "x"} for i in range(12)]
    await run(request("ocr", items), slow, concurrency=3)
    assert peak == 3


async def test_engine_refusal_is_an_item_error_but_unavailability_fails_the_batch() -> None:
    async def refuse(path: str, body: dict[str, Any]) -> Reply:
        raise BackendRejected("engine: prompt too long", 400)

    answer = await run(request("judge", [{"id": "a", "completion": "x"}]), refuse)
    assert answer.results[0].error == "engine: prompt too long"

    async def down(path: str, body: dict[str, Any]) -> Reply:
        raise ServiceUnavailable("no healthy replica", retry_after=5)

    with pytest.raises(ServiceUnavailable):
        await run(request("judge", [{"id": "a", "completion": "x"}]), down)


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


async def test_custom_scorers_sync_async_and_failing() -> None:
    items = [{"id": "a", "completion": "4", "reference": "4"}]
    assert (await run(request("rule", items), FakeBackend())).results[0].score == 1.0
    length = await run(request("length", items), FakeBackend("abc"))
    assert length.results[0].score == pytest.approx(0.3)
    assert length.results[0].response == "abc"
    broken = await run(request("broken", items), FakeBackend())
    assert broken.results[0].error == "scorer broken raised ZeroDivisionError: boom"


def test_unknown_scorer_and_bad_specs() -> None:
    with pytest.raises(UnknownScorer, match="registered: classify, judge, ocr"):
        lookup("nope")
    with pytest.raises(ConfigError, match="NAME=module:function"):
        parse_spec("justaname")
    with pytest.raises(ConfigError, match="cannot load"):
        lookup("x", ("x=tests.support.scoring:missing",))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("https://example.com/a.png", "not a URL"),
        ("file:///etc/passwd", "not a URL"),
        ("%%%", "neither a data URL nor base64"),
        ("", "neither a data URL nor base64"),
    ],
)
def test_images_that_cannot_be_data_urls_are_named(value: str, message: str) -> None:
    with pytest.raises(ItemError, match=message):
        to_data_url(value)


async def test_images_the_checkpoint_refuses_are_item_errors() -> None:
    items = [{"id": "cut", "image": base64.b64encode(png()[:40]).decode(), "reference": "x"},
             {"id": "text", "image": "data:image/png,AAAA", "reference": "x"},
             {"id": "ok", "image": data_url(), "reference": "x"}]
    backend = FakeBackend("x")
    answer = await run(request("ocr", items), backend)
    errors = [r.error for r in answer.results]
    assert errors[0] is not None and "cannot be decoded" in errors[0]
    assert errors[1] is not None and "must be base64" in errors[1]
    assert errors[2] is None and len(backend.calls) == 1  # nothing refused was sent


def test_images_keep_their_bytes_and_get_a_mime_type() -> None:
    raw = png()
    url = to_data_url(base64.b64encode(raw).decode())
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == raw


def test_combine_frames_fingerprints() -> None:
    a = fingerprint({"a": 1}, {"x": 1}, "r0")
    b = fingerprint({"b": 1}, {"x": 2}, "r1")
    assert combine([a]) == a and combine([]) is None
    both = combine([a, b])
    assert both is not None and both.replica == "r0,r1"
    assert both.request_digest not in (a.request_digest, b.request_digest)


def test_item_ids_must_be_unique() -> None:
    with pytest.raises(ValueError, match="appears twice"):
        request("judge", [{"id": "a"}, {"id": "a"}])
