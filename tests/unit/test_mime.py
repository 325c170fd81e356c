"""`sniff_mime`: the media type from the first bytes of bare base64 data, or None."""

from __future__ import annotations

import base64

import pytest

from grm_service.mime import sniff_mime


@pytest.mark.parametrize(("head", "mime"), [
    (b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff\xe0", "image/jpeg"),
    (b"GIF89a", "image/gif"), (b"BM", "image/bmp"), (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"), (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "image/webp"),
    (b"%PDF-1.7", None), (b"RIFF\x00\x00\x00\x00WAVEfmt ", None),
])
def test_media_type_from_the_first_bytes(head: bytes, mime: str | None) -> None:
    assert sniff_mime(base64.b64encode(head + bytes(40)).decode()) == mime


def test_text_that_is_not_base64_has_no_media_type() -> None:
    assert sniff_mime("not base64 at all, with spaces!") is None
