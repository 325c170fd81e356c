"""Score-item images: checked by the gateway's one image check (`grm_service.inputs`) and
normalised to a data URL, with a failure as an item error.

The original bytes are kept (never re-encoded) so the replica sees exactly what the client sent.
"""

from __future__ import annotations

import base64

from grm_service.inputs import ImageError, decode_image_bytes, inspect_image
from grm_service.scoring.context import ItemError

MAX_BYTES = 20 * 1024 * 1024
MAX_PIXELS = 64_000_000
_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif",
            "BMP": "image/bmp", "TIFF": "image/tiff"}


def to_data_url(value: str) -> str:
    """A checked `data:<mime>;base64,...` URL of the same bytes; ItemError says what is wrong."""
    if value.startswith(("http://", "https://", "file:")):
        raise ItemError("image must be inline (data URL or base64), not a URL: a fetched "
                        "image can change between runs")
    try:
        raw = decode_image_bytes(value.strip())
        kind = inspect_image(raw, MAX_BYTES, MAX_PIXELS)
    except ImageError as err:
        raise ItemError(err.message) from None
    mime = _FORMATS.get(kind)
    if mime is None:
        raise ItemError(f"image format {kind or 'unknown'} is not supported")
    return encode_bytes(raw, mime)


def encode_bytes(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"
