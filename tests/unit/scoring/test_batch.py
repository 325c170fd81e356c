from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from grm_service.errors import (
    ReplicaRejected,
    ServiceUnavailable,
)
from grm_service.scoring.batch import combine
from grm_service.scoring.context import Reply
from tests.support.scoring import FakeBackend, data_url, fingerprint, png, request, run


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
        raise ReplicaRejected("engine: prompt too long", 400)

    answer = await run(request("judge", [{"id": "a", "completion": "x"}]), refuse)
    assert answer.results[0].error == "engine: prompt too long"

    async def down(path: str, body: dict[str, Any]) -> Reply:
        raise ServiceUnavailable("no healthy replica", retry_after=5)

    with pytest.raises(ServiceUnavailable):
        await run(request("judge", [{"id": "a", "completion": "x"}]), down)


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


def test_combine_frames_fingerprints() -> None:
    a = fingerprint({"a": 1}, {"x": 1}, "r0")
    b = fingerprint({"b": 1}, {"x": 2}, "r1")
    assert combine([a]) == a and combine([]) is None
    both = combine([a, b])
    assert both is not None and both.replica == "r0,r1"
    assert both.request_digest not in (a.request_digest, b.request_digest)
