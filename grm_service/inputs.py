"""Checks on what users send before an engine sees it: images and the URLs they come from.

Remote image URLs are refused unless allowlisted: the engine would fetch them from inside the
cluster (server-side request forgery). Inline images are decoded with Pillow, so a broken or
oversized image is a 400 naming the problem, not an engine crash.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Iterator
from typing import Any

from PIL import Image, UnidentifiedImageError

from grm_service.config import Settings
from grm_service.errors import InvalidRequest

_DATA_PREFIX = "data:"


class ImageError(InvalidRequest):
    code = "invalid_image"


def decode_image_bytes(value: str) -> bytes:
    """Bytes of a data URL (`data:image/png;base64,...`) or of bare base64."""
    payload = value
    if value.startswith(_DATA_PREFIX):
        header, _, payload = value.partition(",")
        if ";base64" not in header:
            raise ImageError("image data URL must be base64-encoded (data:image/...;base64,...)")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("image is not valid base64") from None


def check_image(data: bytes, settings: Settings) -> tuple[int, int]:
    """Decode fully (a truncated file fails here, not in the engine); returns (width, height)."""
    if len(data) > settings.max_image_bytes:
        raise ImageError(f"image is {len(data)} bytes; the limit is {settings.max_image_bytes}")
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if width * height > settings.max_image_pixels:
                limit = settings.max_image_pixels
                raise ImageError(f"image is {width}x{height} pixels; the limit is {limit} pixels")
            img.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise ImageError(f"image cannot be decoded: {err}") from None
    return width, height


def check_image_url(url: str, settings: Settings) -> None:
    if url.startswith(_DATA_PREFIX):
        check_image(decode_image_bytes(url), settings)
        return
    if any(url.startswith(prefix) for prefix in settings.image_url_allowlist):
        return
    raise ImageError(
        "remote image URLs are refused (the engine would fetch them: server-side request "
        "forgery); send the image inline as a data URL, or allowlist the prefix with "
        "--image-url-allowlist"
    )


def _image_urls(messages: list[dict[str, Any]]) -> Iterator[str]:
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict):
                continue
            for key in ("image_url", "video_url", "input_image"):
                ref = part.get(key)
                url = ref.get("url") if isinstance(ref, dict) else ref
                if isinstance(url, str):
                    yield url


def has_images(messages: list[dict[str, Any]]) -> bool:
    return next(_image_urls(messages), None) is not None


def check_messages(messages: list[dict[str, Any]], settings: Settings) -> None:
    for url in _image_urls(messages):
        check_image_url(url, settings)
