"""Checks on what users send before an engine sees it: images and the URLs they come from.

Remote image URLs are refused unless allowlisted: the engine would fetch them from inside the
cluster (server-side request forgery). Inline images are decoded with Pillow, so a broken or
oversized image is a 400 naming the problem, not an engine crash.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
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


def inspect_image(data: bytes, max_bytes: int, max_pixels: int) -> str:
    """Decode fully (a truncated file fails here, not in the engine); returns Pillow's format."""
    if not data:
        raise ImageError("image is empty")
    if len(data) > max_bytes:
        raise ImageError(f"image is {len(data)} bytes; the limit is {max_bytes}")
    try:
        with warnings.catch_warnings():
            # Pillow warns, then raises, on decompression bombs; the size check below says more.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                width, height = img.size
                if width * height > max_pixels:
                    raise ImageError(f"image is {width}x{height} pixels; the limit is "
                                     f"{max_pixels} pixels")
                img.load()
                return str(img.format or "")
    except UnidentifiedImageError:
        raise ImageError("image cannot be decoded: not a known image format") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ImageError(f"image cannot be decoded: {err}") from None


def check_image(data: bytes, settings: Settings) -> str:
    return inspect_image(data, settings.max_image_bytes, settings.max_image_pixels)


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
