"""The checkpoint's pure parts, by table: JSON shape, allow-list entries, seeds, image framing.

What reaches an engine through HTTP is tested in tests/integration/test_hostile_input.py.
"""

from __future__ import annotations

import base64
import io
import json
import random
from typing import Any

import pytest
from PIL import Image

from grm_service.errors import ConfigError, ImageError, InvalidRequest, OverLimit
from grm_service.gateway.request import longstrings
from grm_service.gateway.request.checkpoint import (
    Limits,
    Origin,
    check_body,
    check_images,
    check_seed,
)
from grm_service.gateway.request.images import ImageLimits
from grm_service.gateway.request.shape import json_shape

LIMITS = Limits(ImageLimits(max_bytes=1 << 20, max_pixels=100_000))


TRICKY = ['"', "\\", '\\"', "[[{", "]}", ",,", "\\\\", "é[", "\u2028", ""]


def random_json(rng: random.Random, depth: int) -> Any:
    kind = rng.randrange(5 if depth < 12 else 2)
    if kind == 0:
        return "".join(rng.choice(TRICKY) for _ in range(rng.randrange(4)))
    if kind == 1:
        return rng.choice([0, -1.5, True, None, 10**30])
    if kind == 2:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = [rng.choice(TRICKY) + str(i) for i in range(rng.randrange(4))]
    return {key: random_json(rng, depth + 1) for key in keys}


def true_shape(value: Any) -> tuple[int, int]:
    """(values and keys, depth) by walking the parsed value."""
    if isinstance(value, list):
        inner = [true_shape(v) for v in value]
        return 1 + sum(n for n, _ in inner), 1 + max((d for _, d in inner), default=0)
    if isinstance(value, dict):
        inner = [true_shape(v) for v in value.values()]
        return 1 + len(value) + sum(n for n, _ in inner), 1 + max((d for _, d in inner),
                                                                  default=0)
    return 1, 0


@pytest.mark.parametrize("strings", ["few", "many"])
def test_json_shape_matches_the_parsed_value(strings: str) -> None:
    rng = random.Random(7)
    for _ in range(300):
        value = random_json(rng, 0)
        if strings == "many":  # past the one-by-one string search: the split path
            value = [["x"] * 300, value]
        raw = json.dumps(value, ensure_ascii=rng.random() < 0.5).encode()
        values, depth = json_shape(raw)
        true_values, true_depth = true_shape(value)
        assert depth == true_depth, raw
        assert true_values <= values <= 2 * true_values, raw


@pytest.mark.parametrize(
    "entry", ["ftp://h", "https://user@h", "https://h/?q=1", "https://h:99999", "h.example.com"]
)
def test_bad_allow_list_entries_fail_start_up(entry: str) -> None:
    with pytest.raises(ConfigError):
        Origin.parse(entry)


@pytest.mark.parametrize("seed", [None, 0, 7, 2**63 - 1])
def test_engine_seeds_pass(seed: Any) -> None:
    check_seed(seed)


@pytest.mark.parametrize("seed", [True, False, 1.0, 1.9, "1", [1], {"a": 1}, -1, 2**63])
def test_other_seeds_are_refused(seed: Any) -> None:
    with pytest.raises(InvalidRequest, match="seed"):
        check_seed(seed)


def test_caps_name_their_setting() -> None:
    chat = {"messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(OverLimit, match="GRM_MAX_N"):
        check_body("/v1/chat/completions", {**chat, "best_of": 17}, LIMITS)
    with pytest.raises(InvalidRequest, match="n must be an integer"):
        check_body("/v1/chat/completions", {**chat, "n": "2"}, LIMITS)
    with pytest.raises(OverLimit, match="GRM_MAX_TOKENS_LIMIT"):
        check_body("/v1/chat/completions", {**chat, "min_tokens": 10**6}, LIMITS)


def _noisy_png() -> str:
    rng = random.Random(1)
    img = Image.frombytes("L", (120, 120), bytes(rng.randrange(256) for _ in range(14400)))
    out = io.BytesIO()
    img.save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


PNG64 = _noisy_png()


@pytest.mark.parametrize("url", [
    "data:image/png;base64," + PNG64,
    "data:image/png;base64," + PNG64[:-8],  # truncated
    "data:image/png;base64," + PNG64[:5000] + "!" + PNG64[5001:],  # not base64
    "data:image/png;base64," + PNG64[:5000] + "é" + PNG64[5001:],  # not ASCII
    "data:image/pngé;base64," + PNG64,  # not ASCII before the payload: offsets differ
    "data:image/png;base64" + PNG64,  # no comma
    "data:text/plain;base64," + PNG64,
    "data:image/png;utf8," + PNG64,
])
def test_images_checked_from_the_body_bytes_as_from_the_string(url: str) -> None:
    """The hot path decodes a lifted image from the request bytes: same verdict, same words."""
    raw = json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}]}]}, ensure_ascii=False).encode()
    lifted = longstrings.Lifted()
    body = longstrings.loads(raw, lifted=lifted)
    found = body["messages"][0]["content"][0]["image_url"]["url"]
    assert lifted.bytes_of(found) is not None

    def verdict(given: longstrings.Lifted | None) -> str:
        try:
            check_images([found], LIMITS, given)
        except ImageError as err:
            return err.message
        return "ok"

    assert verdict(lifted) == verdict(None)
