"""verl-omni's visual reward managers: OCR, CLIP-family and reward-head rewards for the images a
policy generates (`compute_score_ocr`, `compute_score_clip`, `compute_score_reward_head`).

    reward.custom_reward_function.path=pkg://grm_service.integrations.verl_omni
    reward.custom_reward_function.name=compute_score_ocr
    +reward.custom_reward_function.reward_kwargs.url=http://grm-service:8000

verl-omni's `VisualRewardManager` (and each entry of `MultiVisualRewardManager`) calls the function
by keyword, once per sample: `data_source`, `solution_image` (the generated pixels), `ground_truth`
(the text the image should show), `extra_info`, and, when a reward model is configured,
`reward_router_address`, `reward_model_tokenizer`, `model_name` (accepted, unused: the service is
`url`) and `sampling_params` (its reward model's sampling, with `seed` once its determinism switch
is on), which reach the engine as verl-omni's own function sends them. `full_determinism` and
`seed` in `reward_kwargs` map verl-omni's switch where no reward model is configured (docs:
"verl-omni"). The image is made PNG and scored with the `ocr` scorer (or a preset of it) through
`/v1/score`; the answer is `{"score", "genrm_response", "grm_fingerprint", "grm_error"}`, the first
two as verl-omni's own `compute_score_ocr` returns them.

`solution_image`: a torch tensor or numpy array, uint8 in [0, 255] or floating point in [0, 1];
a PIL image; or the bytes of an encoded image (sent as they are). Shapes, as verl-omni reads them:

- 2-D `(H, W)` and 3-D `(C, H, W)` or `(H, W, C)`: one image;
- 4-D, a video: `(F, H, W, C)` when the last axis is 1 or 3, else `(C, F, H, W)` when the first is
  3 (verl-omni's reading: `(3, 1, H, W)` is one RGB frame), else the rollout's `(T, C, H, W)`,
  which verl-omni's own function does not read; every `extra_info["frame_interval"]`-th frame
  (default 4) is scored;
- 5-D, a batch of videos (`(B, ...)` of the 4-D shapes): every frame unless `frame_interval`.

The frames of one sample are one item; its score is their mean (the `ocr` scorer's rule,
verl-omni's too). A sample that is not pixels (a 1-D tensor, a latent) fails like a failed item:
it raises, or gives `error_score` with `grm_error` 1.0 when that is set.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
from collections.abc import Mapping
from typing import Any

try:  # the client distribution's `verl-omni` extra (verl-omni's environment has both)
    import numpy as np
    from PIL import Image
except ModuleNotFoundError as missing:
    raise ModuleNotFoundError(
        f"grm_service.integrations.verl_omni needs numpy and pillow ({missing.name} is not "
        "installed): pip install 'grm-service-client[verl-omni]'", name=missing.name
    ) from missing

from grm_service.integrations.common import (
    KEY_ENV,
    RETRIES,
    TIMEOUT_S,
    Endpoint,
    ScoringError,
    endpoint,
    no_key_in_config,
    reward_or,
)
from grm_service.integrations.microbatch import WAIT_S, batcher, close_clients
from grm_service.integrations.truths import references
from grm_service.mime import encode_bytes, sniff_mime
from grm_service.wire import ItemResult, ScoreItem

__all__ = ["close_clients", "compute_score_clip", "compute_score_ocr",
           "compute_score_reward_head", "frames_of"]

logger = logging.getLogger(__name__)

_CHANNELS = (1, 3)
# verl-omni's default frame step per rank: images all, a video every 4th, a batch all.
_DEFAULT_INTERVAL = {2: 1, 3: 1, 4: 4, 5: 1}


def as_array(image: Any) -> np.ndarray:
    """A numpy array of a torch tensor or array; uint8, floats in [0, 1] scaled to it."""
    if hasattr(image, "detach"):  # torch, without importing it
        image = image.detach().cpu().numpy()
    try:
        array = np.asarray(image)
    except (TypeError, ValueError) as err:  # ragged lists, objects numpy cannot hold
        raise ScoringError(f"solution_image of type {type(image).__name__} is not pixels: "
                           f"{err}") from None
    if array.size == 0:
        raise ScoringError(f"solution_image of shape {array.shape} holds no pixels")
    if array.dtype == np.uint8:
        return array
    if array.dtype.kind not in "fiu":
        raise ScoringError(f"solution_image of dtype {array.dtype} is not pixels")
    if array.dtype.kind == "f":
        low, high = float(array.min()), float(array.max())
        if not (low >= 0.0 and high <= 1.0):
            raise ScoringError(f"solution_image is floating point in [{low:.3g}, {high:.3g}]: "
                               "give uint8 pixels or floats in [0, 1] (a latent is not scored)")
        return np.asarray(np.rint(array * 255.0), dtype=np.uint8)
    if int(array.min()) < 0 or int(array.max()) > 255:
        raise ScoringError("solution_image integers must lie in [0, 255]")
    return array.astype(np.uint8)


def _video(array: np.ndarray, step: int) -> list[np.ndarray]:
    """A 4-D video's frames as (H, W, C), every `step`-th. verl-omni's reading first: channels
    last when the last axis is 1 or 3, else channels first when the first is 3; then the
    rollout's (T, C, H, W), which verl-omni's own function cannot read; then (1, F, H, W)."""
    if array.shape[-1] in _CHANNELS:
        frames = array  # (F, H, W, C)
    elif array.shape[0] == 3:
        frames = array.transpose(1, 2, 3, 0)  # (C, F, H, W)
    elif array.shape[1] in _CHANNELS:
        frames = array.transpose(0, 2, 3, 1)  # (T, C, H, W)
    elif array.shape[0] == 1:
        frames = array.transpose(1, 2, 3, 0)  # (C, F, H, W), one grey channel
    else:
        raise ScoringError(f"solution_image of shape {array.shape} has no axis of 1 or 3 "
                           "channels")
    return list(frames[::step])


def _image(array: np.ndarray) -> np.ndarray:
    if array.ndim == 2:
        return array[:, :, None]
    if array.shape[-1] in _CHANNELS and array.shape[0] not in _CHANNELS:
        return array
    if array.shape[0] in _CHANNELS:
        return array.transpose(1, 2, 0)
    raise ScoringError(f"solution_image of shape {array.shape} has no axis of 1 or 3 channels")


def frames_of(solution_image: Any, frame_interval: int | None = None) -> list[np.ndarray]:
    """The (H, W, C) uint8 frames scored for one sample, by verl-omni's frame rules."""
    array = as_array(solution_image)
    if array.ndim not in _DEFAULT_INTERVAL:
        raise ScoringError(f"solution_image has {array.ndim} dimensions; 2 to 5 are images, "
                           "videos and batches of videos")
    step = frame_interval or _DEFAULT_INTERVAL[array.ndim]
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ScoringError(f"frame_interval must be a whole number >= 1, not {step!r}")
    if array.ndim <= 3:
        return [_image(array)]
    videos = [array] if array.ndim == 4 else list(array)
    return [frame for video in videos for frame in _video(video, step)]


def png(frame: np.ndarray) -> str:
    picture = Image.fromarray(frame[:, :, 0] if frame.shape[-1] == 1 else frame)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return encode_bytes(buffer.getvalue())


def data_urls(solution_image: Any, frame_interval: int | None) -> list[str]:
    """The sample's images as data URLs: PNG of the pixels, or the given bytes as they are."""
    if isinstance(solution_image, bytes | bytearray):
        text = base64.b64encode(bytes(solution_image)).decode("ascii")
        mime = sniff_mime(text)
        if mime is None:
            raise ScoringError("solution_image bytes are not a PNG, JPEG, WebP, GIF, BMP or TIFF")
        return [f"data:{mime};base64,{text}"]
    if hasattr(solution_image, "save") and hasattr(solution_image, "convert"):  # PIL
        mode = "L" if solution_image.mode in ("L", "1") else "RGB"
        solution_image = np.asarray(solution_image.convert(mode))
    return [png(frame) for frame in frames_of(solution_image, frame_interval)]


def reward_info(result: ItemResult, error_score: float | None) -> dict[str, Any]:
    response = result.response[-1] if isinstance(result.response, list) else result.response
    fingerprint = result.fingerprint.fingerprint_id if result.fingerprint else ""
    return {"score": reward_or(result, error_score), "genrm_response": response or "",
            "grm_fingerprint": fingerprint, "grm_error": float(result.status == "error")}


def unreadable(err: ScoringError, error_score: float | None) -> dict[str, Any]:
    """A sample that is not pixels: `error_score` where set (verl-omni awaits the function
    without catching, so a raise ends the training step), else the error itself."""
    if error_score is None:
        raise err
    logger.warning("verl-omni sample not scored, reward %s: %s", error_score, err)
    return {"score": error_score, "genrm_response": "", "grm_fingerprint": "", "grm_error": 1.0}


def sampling_of(
    sampling: Mapping[str, Any] | None, sampling_params: Mapping[str, Any] | None,
    full_determinism: bool, seed: int | None,
) -> dict[str, Any]:
    """What the engine samples with, key by key: verl-omni's `sampling_params` (its reward
    model's settings; what it leaves None, the scorer's), the seed of its determinism switch
    mapped in `reward_kwargs`, then `sampling` from `reward_kwargs` over both."""
    merged = {k: v for k, v in (sampling_params or {}).items() if v is not None}
    if full_determinism:
        if seed is None:
            raise ScoringError("full_determinism=true needs seed=... (verl-omni's "
                               "reward.reward_model.rollout.seed)")
        merged["seed"] = seed
    merged.update(sampling or {})
    return merged


async def compute_score_ocr(
    data_source: str, solution_image: Any, ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None, *, url: str | None = None,
    scorer: str = "ocr", sampling: Mapping[str, Any] | None = None,
    error_score: float | None = None, headers: Mapping[str, str] | None = None,
    timeout: float = TIMEOUT_S, retries: int = RETRIES, batch_size: int = 32,
    batch_wait_s: float = WAIT_S, api_key_env: str = KEY_ENV, api_key: str | None = None,
    full_determinism: bool = False, seed: int | None = None,
    reward_router_address: str | None = None, reward_model_tokenizer: Any = None,
    model_name: str | None = None, sampling_params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One generated image or video, scored by OCR against `ground_truth`; a failed item raises
    (verl-omni's managers: a failed run, or 0 for a non-required entry) unless `error_score`.
    `seed` reaches the engine only with `full_determinism`, as verl-omni's switch works."""
    no_key_in_config(api_key, "verl-omni")
    where = endpoint(url, None, headers, batch_size, timeout=timeout, retries=retries,
                     api_key_env=api_key_env)
    params = sampling_of(sampling, sampling_params, full_determinism, seed)
    interval = (extra_info or {}).get("frame_interval")
    try:
        # PNG encoding takes milliseconds per frame: off the loop, as verl-omni does its own.
        urls = await asyncio.to_thread(data_urls, solution_image, interval)
    except ScoringError as err:
        return unreadable(err, error_score)
    answers = references(ground_truth)
    item = ScoreItem(id="0", image=urls[0] if len(urls) == 1 else urls,
                     reference=answers[0] if answers else None,
                     extra={"data_source": str(data_source)})
    result = await batcher(where, scorer, None, params, batch_wait_s).score(item)
    return reward_info(result, error_score)


def prompt_of(ground_truth: Any) -> str:
    """The text an image is scored against: verl-omni's own PickScore and HPSv3 rewards read
    the sample's `ground_truth` as the prompt (a list: its first entry), "" when it has none."""
    answers = references(ground_truth)
    return answers[0] if answers else ""


async def _score_against_prompt(
    scorer: str, solution_image: Any, ground_truth: Any, extra_info: Mapping[str, Any] | None,
    options: Mapping[str, Any] | None, where: Endpoint, error_score: float | None, scale: float,
    batch_wait_s: float, data_source: str,
) -> dict[str, Any]:
    interval = (extra_info or {}).get("frame_interval")
    try:
        urls = await asyncio.to_thread(data_urls, solution_image, interval)
    except ScoringError as err:
        return {**unreadable(err, error_score), "grm_raw": error_score}
    item = ScoreItem(id="0", image=urls[0] if len(urls) == 1 else urls,
                     prompt=prompt_of(ground_truth), extra={"data_source": str(data_source)})
    result = await batcher(where, scorer, options, None, batch_wait_s).score(item)
    info = reward_info(result, error_score)
    if result.status == "ok" and result.score is not None:
        info["score"] = result.score * scale
    info["grm_raw"] = result.score if result.status == "ok" else error_score
    return info


async def compute_score_clip(
    data_source: str, solution_image: Any, ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None, *, url: str | None = None,
    scorer: str = "clip", options: Mapping[str, Any] | None = None, scale: float = 1.0,
    error_score: float | None = None, headers: Mapping[str, str] | None = None,
    timeout: float = TIMEOUT_S, retries: int = RETRIES, batch_size: int = 32,
    batch_wait_s: float = WAIT_S, api_key_env: str = KEY_ENV, api_key: str | None = None,
    reward_router_address: str | None = None, reward_model_tokenizer: Any = None,
    model_name: str | None = None, sampling_params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One generated image (or video: its frames, one item) scored by a CLIP-family model
    (PickScore, HPSv2 shapes) against its prompt, `ground_truth` as verl-omni's own PickScore
    reward reads it; `options` go to the `clip` scorer as they are. `score` is the service's
    score times `scale` (verl-omni's PickScore divides by 26: `scale` 1/26 gives its range),
    `grm_raw` the service's own. A failed item raises unless `error_score`. The
    reward-model keywords verl-omni adds are accepted, unused: the service is `url`, and a
    pooling model samples nothing."""
    no_key_in_config(api_key, "verl-omni")
    where = endpoint(url, None, headers, batch_size, timeout=timeout, retries=retries,
                     api_key_env=api_key_env)
    return await _score_against_prompt(scorer, solution_image, ground_truth, extra_info,
                                       options, where, error_score, scale, batch_wait_s,
                                       data_source)


async def compute_score_reward_head(
    data_source: str, solution_image: Any, ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None, *, url: str | None = None,
    scorer: str = "reward_head", options: Mapping[str, Any] | None = None,
    error_score: float | None = None, headers: Mapping[str, str] | None = None,
    timeout: float = TIMEOUT_S, retries: int = RETRIES, batch_size: int = 32,
    batch_wait_s: float = WAIT_S, api_key_env: str = KEY_ENV, api_key: str | None = None,
    reward_router_address: str | None = None, reward_model_tokenizer: Any = None,
    model_name: str | None = None, sampling_params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One generated image or video scored by a VLM reward head (HPSv3's shape) against its
    prompt, `ground_truth` as verl-omni's own HPSv3 reward reads it; `options` go to the
    `reward_head` scorer (`template`, `head`, `label`, `scale`: its docstring). `score` and
    `grm_raw` are the service's score; a failed item raises unless `error_score`."""
    no_key_in_config(api_key, "verl-omni")
    where = endpoint(url, None, headers, batch_size, timeout=timeout, retries=retries,
                     api_key_env=api_key_env)
    return await _score_against_prompt(scorer, solution_image, ground_truth, extra_info,
                                       options, where, error_score, 1.0, batch_wait_s,
                                       data_source)
