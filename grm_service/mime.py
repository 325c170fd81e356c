"""Naming an image: whether a string is a data URL, and the media type of bare base64 image data
from its first bytes, without decoding it. The clients (the trainers' adapters), the scorers and
the gateway's checkpoint all need these; a leaf, so that client-side code does not import the
gateway's request side for them. Client-side code: the standard library only (the client
distribution ships it); the 32 characters `sniff_mime` decodes gain nothing from a SIMD decoder."""

from __future__ import annotations

import base64
import binascii

DATA_URL_PREFIX = "data:"
_MAGIC = {b"\x89PNG": "image/png", b"\xff\xd8\xff": "image/jpeg", b"GIF8": "image/gif",
          b"BM": "image/bmp", b"II*\x00": "image/tiff", b"MM\x00*": "image/tiff"}


def sniff_mime(payload: str) -> str | None:
    """The media type of bare base64 image data, from its first bytes (no full decode)."""
    head = payload[:32]
    try:
        start = base64.b64decode(head[: len(head) // 4 * 4], validate=True)
    except (binascii.Error, ValueError):
        return None
    for prefix, mime in _MAGIC.items():
        if start.startswith(prefix):
            return mime
    return "image/webp" if start[:4] == b"RIFF" and start[8:12] == b"WEBP" else None


def is_data_url(url: str) -> bool:
    return url[:5].lower() == DATA_URL_PREFIX


def encode_bytes(raw: bytes, mime: str = "image/png") -> str:
    """A data URL of `raw`, as they are."""
    return f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"
