"""verl-omni's image and video inputs, by its frame rules, made PNG; the batched calls."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from grm_service.client import AsyncGrmClient
from grm_service.integrations import verl_omni
from grm_service.integrations.common import ScoringError
from grm_service.integrations.microbatch import MicroBatcher
from grm_service.wire import ScoreItem


def video(frames: int, shape: str) -> np.ndarray:
    """Frame i is filled with value 10 * i, so a test can tell which frames were kept."""
    thwc = np.stack([np.full((4, 6, 3), 10 * i, dtype=np.uint8) for i in range(frames)])
    order = {"THWC": (0, 1, 2, 3), "TCHW": (0, 3, 1, 2), "CTHW": (3, 0, 1, 2)}[shape]
    return thwc.transpose(order)


def values(frames: list[np.ndarray]) -> list[int]:
    assert all(f.shape == (4, 6, 3) and f.dtype == np.uint8 for f in frames)
    return [int(f[0, 0, 0]) for f in frames]


@pytest.mark.parametrize("shape", ["THWC", "TCHW", "CTHW"])
def test_a_video_keeps_every_fourth_frame_unless_told(shape: str) -> None:
    assert values(verl_omni.frames_of(video(9, shape))) == [0, 40, 80]
    assert values(verl_omni.frames_of(video(9, shape), 2)) == [0, 20, 40, 60, 80]


def test_a_batch_of_videos_keeps_every_frame_unless_told() -> None:
    batch = np.stack([video(3, "TCHW"), video(3, "TCHW")])
    assert values(verl_omni.frames_of(batch)) == [0, 10, 20, 0, 10, 20]
    assert values(verl_omni.frames_of(batch, 2)) == [0, 20, 0, 20]


def test_one_image_in_every_form_is_the_same_png() -> None:
    hwc = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    chw = hwc.transpose(2, 0, 1)
    png = verl_omni.data_urls(hwc, None)
    assert verl_omni.data_urls(chw, None) == png
    assert verl_omni.data_urls(Image.fromarray(hwc), None) == png
    assert verl_omni.data_urls(chw.astype(np.float32) / 255.0, None) == png
    decoded = Image.open(io.BytesIO(base64.b64decode(png[0].split(",", 1)[1])))
    assert np.array_equal(np.asarray(decoded), hwc)
    raw = base64.b64decode(png[0].split(",", 1)[1])
    assert verl_omni.data_urls(raw, None) == png, "bytes are sent as they are"
    gray = verl_omni.frames_of(np.zeros((1, 5, 7), dtype=np.uint8))
    assert gray[0].shape == (5, 7, 1)


@pytest.mark.parametrize(("image", "message"), [
    (np.full((3, 4, 4), 2.0, dtype=np.float32), "floating point in"),
    (np.zeros((5, 5, 5), dtype=np.uint8), "1 or 3 channels"),
    (np.zeros((4,), dtype=np.uint8), "dimensions"),
    (b"not an image", "bytes are not"),
])
def test_what_is_not_pixels_is_refused(image: Any, message: str) -> None:
    with pytest.raises(ScoringError, match=message):
        verl_omni.data_urls(image, None)


async def test_calls_at_the_same_time_go_out_as_one_batch() -> None:
    bodies: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        results = [{"id": i["id"], "score": float(i["reference"]), "status": "ok",
                    "digest": "d"} for i in body["items"]]
        return httpx.Response(200, json={"results": results, "fingerprint": {
            "fingerprint_id": "f", "scorer": body["scorer"], "items": len(results),
            "errors": 0, "digest": "d"}})

    client = AsyncGrmClient("http://x", transport=httpx.MockTransport(answer))
    batcher = MicroBatcher(client, "ocr", {}, {"max_tokens": 9}, max_items=3, wait_s=0.05)
    items = [ScoreItem(id="0", reference=str(n)) for n in range(5)]
    results = await asyncio.gather(*(batcher.score(i) for i in items))
    await client.aclose()
    assert [r.score for r in results] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [len(b["items"]) for b in bodies] == [3, 2]  # full at 3, the rest after wait_s
    assert [i["id"] for i in bodies[0]["items"]] == ["0", "1", "2"]
    assert bodies[0]["sampling"] == {"max_tokens": 9}
