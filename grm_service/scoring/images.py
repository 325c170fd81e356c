"""Image inputs: decode, check with Pillow and normalise to a data URL, off the event loop.

The original bytes are kept (never re-encoded) so the replica sees exactly what the client sent.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings

from PIL import Image, UnidentifiedImageError

from grm_service.scoring.context import ItemError

MAX_BYTES = 20 * 1024 * 1024
MAX_SIDE = 16384
MAX_PIXELS = 64_000_000
_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif",
            "BMP": "image/bmp", "TIFF": "image/tiff"}


def _payload(value: str) -> str:
    if value.startswith("data:"):
        header, sep, data = value.partition(",")
        if not sep or not header.endswith(";base64"):
            raise ItemError("image data URL must be base64: data:image/<type>;base64,<data>")
        return data
    if value.startswith(("http://", "https://", "file:")):
        raise ItemError("image must be inline (data URL or base64), not a URL: a fetched "
                        "image can change between runs")
    return value


def _decode(value: str) -> bytes:
    try:
        raw = base64.b64decode(_payload(value).strip(), validate=True)
    except (binascii.Error, ValueError) as err:
        raise ItemError(f"image is not valid base64: {err}") from None
    if not raw:
        raise ItemError("image is empty")
    if len(raw) > MAX_BYTES:
        raise ItemError(f"image is {len(raw)} bytes; the limit is {MAX_BYTES}")
    return raw


def _inspect(raw: bytes) -> str:
    """The MIME type of a decodable image of sane size, else ItemError."""
    try:
        with warnings.catch_warnings():
            # Pillow warns, then raises, on decompression bombs; we want one clear error.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw)) as img:
                width, height = img.size
                if not 1 <= width <= MAX_SIDE or not 1 <= height <= MAX_SIDE:
                    raise ItemError(f"image is {width}x{height}; each side must be 1..{MAX_SIDE}")
                if width * height > MAX_PIXELS:
                    raise ItemError(f"image has {width * height} pixels; limit {MAX_PIXELS}")
                img.load()
                kind = img.format or ""
    except ItemError:
        raise
    except UnidentifiedImageError:
        raise ItemError("image cannot be decoded: not a known image format") from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombWarning,
            Image.DecompressionBombError) as err:
        raise ItemError(f"image cannot be decoded: {err}") from None
    mime = _FORMATS.get(kind)
    if mime is None:
        raise ItemError(f"image format {kind or 'unknown'} is not supported")
    return mime


def to_data_url(value: str) -> str:
    """A checked `data:<mime>;base64,...` URL of the same bytes; ItemError says what is wrong."""
    raw = _decode(value)
    mime = _inspect(raw)
    return f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"


def encode_bytes(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"
