"""verl-omni's image and video inputs, by its frame rules, made PNG; the batched calls."""

from __future__ import annotations

import asyncio
import base64
import inspect
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
    batch = np.stack([video(4, "TCHW"), video(4, "TCHW")])
    assert values(verl_omni.frames_of(batch)) == [0, 10, 20, 30, 0, 10, 20, 30]
    assert values(verl_omni.frames_of(batch, 2)) == [0, 20, 0, 20]
    # Three frames of three channels: (C, F, H, W), as verl-omni reads a 4-D shape.
    assert values(verl_omni.frames_of(np.stack([video(3, "CTHW")] * 2))) == [0, 10, 20] * 2


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


def test_a_channels_first_video_of_one_frame_is_one_rgb_frame() -> None:
    # verl-omni reads a 4-D tensor whose last axis is not channels as (C, F, H, W): (3, 1, H, W)
    # is one RGB frame, never three grey ones.
    rgb = np.random.default_rng(1).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    (frame,) = verl_omni.frames_of(rgb.transpose(2, 0, 1)[:, None])
    assert frame.shape == (5, 7, 3) and np.array_equal(frame, rgb)
    # The rollout's (T, C, H, W) where verl-omni's own reading fails: one frame, then grey ones.
    (frame,) = verl_omni.frames_of(rgb.transpose(2, 0, 1)[None])
    assert np.array_equal(frame, rgb)
    grey = verl_omni.frames_of(np.zeros((1, 5, 4, 6), dtype=np.uint8))
    assert [f.shape for f in grey] == [(4, 6, 1), (4, 6, 1)]  # (1, F, H, W): every 4th frame


@pytest.mark.parametrize(("image", "message"), [
    (np.full((3, 4, 4), 2.0, dtype=np.float32), "floating point in"),
    (np.zeros((5, 5, 5), dtype=np.uint8), "1 or 3 channels"),
    (np.zeros((4,), dtype=np.uint8), "dimensions"),
    (b"not an image", "bytes are not"),
])
def test_what_is_not_pixels_is_refused(image: Any, message: str) -> None:
    with pytest.raises(ScoringError, match=message):
        verl_omni.data_urls(image, None)


@pytest.mark.parametrize("image", [np.zeros((4,), dtype=np.uint8), [[1, 2], [3]],
                                   np.full((3, 4, 4), 2.0, dtype=np.float32),
                                   np.zeros((3, 0, 4), dtype=np.float32)])
async def test_a_sample_that_is_not_pixels_gets_error_score(image: Any) -> None:
    # verl-omni awaits the function without catching: a raise would end the training step.
    # Nothing is sent: the URL is never reached.
    info = await verl_omni.compute_score_ocr("ocr", image, "HELLO", {}, url="http://127.0.0.1:9",
                                             error_score=-1.0)
    assert info == {"score": -1.0, "genrm_response": "", "grm_fingerprint": "",
                    "grm_error": 1.0}
    with pytest.raises(ScoringError):
        await verl_omni.compute_score_ocr("ocr", image, "HELLO", {}, url="http://127.0.0.1:9")


def test_sampling_verl_omni_passes_then_its_switch_then_reward_kwargs() -> None:
    passed = {"temperature": 1.0, "top_k": -1, "top_p": 1, "max_tokens": 2048, "seed": 42}
    assert verl_omni.sampling_of(None, passed, False, None) == passed
    assert verl_omni.sampling_of(None, {"temperature": None, "top_p": 0.5}, False, 3) == {
        "top_p": 0.5}, "None is the scorer's default; the seed waits for the switch"
    assert verl_omni.sampling_of(None, None, True, 7) == {"seed": 7}
    assert verl_omni.sampling_of({"seed": 9, "max_tokens": 64}, passed, True, 7) == {
        **passed, "seed": 9, "max_tokens": 64}
    with pytest.raises(ScoringError, match="seed"):
        verl_omni.sampling_of(None, None, True, None)


def test_the_call_shapes_of_verl_omni_are_accepted() -> None:
    params = inspect.signature(verl_omni.compute_score_ocr).parameters
    # What its managers pass once a reward model is configured, and its determinism switch.
    assert {"reward_router_address", "reward_model_tokenizer", "model_name", "sampling_params",
            "full_determinism", "seed"} <= set(params)
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values()), "typos fail by name"


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


@pytest.mark.parametrize("function", [verl_omni.compute_score_clip,
                                      verl_omni.compute_score_reward_head])
async def test_image_against_prompt_adapters_take_verl_omnis_call(function: Any) -> None:
    params = inspect.signature(function).parameters
    assert {"data_source", "solution_image", "ground_truth", "extra_info",
            "reward_router_address", "reward_model_tokenizer", "model_name",
            "sampling_params", "options"} <= set(params)
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values()), "typos fail by name"
    info = await function("pick", np.zeros((4,), dtype=np.uint8), "a fox", {},
                          url="http://127.0.0.1:9", error_score=-1.0)
    assert info == {"score": -1.0, "genrm_response": "", "grm_fingerprint": "",
                    "grm_error": 1.0, "grm_raw": -1.0}


def test_the_prompt_is_ground_truth_as_verl_omni_reads_it() -> None:
    assert verl_omni.prompt_of("a fox") == "a fox"
    assert verl_omni.prompt_of(np.array(["a fox", "a dog"])) == "a fox"
    assert verl_omni.prompt_of(None) == ""
