"""The media type of bare base64 image data, from its first bytes: what the clients (the
trainers' adapters) and the scorers need to name an image in a data URL, without decoding it.
A leaf, so that client-side code does not import the gateway's request side for it."""

from __future__ import annotations

import binascii

import pybase64

_MAGIC = {b"\x89PNG": "image/png", b"\xff\xd8\xff": "image/jpeg", b"GIF8": "image/gif",
          b"BM": "image/bmp", b"II*\x00": "image/tiff", b"MM\x00*": "image/tiff"}


def sniff_mime(payload: str) -> str | None:
    """The media type of bare base64 image data, from its first bytes (no full decode)."""
    head = payload[:32]
    try:
        start = pybase64.b64decode(head[: len(head) // 4 * 4], validate=True)
    except (binascii.Error, ValueError):
        return None
    for prefix, mime in _MAGIC.items():
        if start.startswith(prefix):
            return mime
    return "image/webp" if start[:4] == b"RIFF" and start[8:12] == b"WEBP" else None
