"""Image framing, by table: whole images pass, truncated, flipped, huge or unlisted ones are
refused from their bytes."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from grm_service.errors import ImageError
from grm_service.gateway.request.images import ImageLimits, check_image


def encoded(fmt: str, size: tuple[int, int] = (300, 200)) -> bytes:
    out = io.BytesIO()
    Image.effect_noise(size, 40).convert("RGB").save(out, fmt)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"])
def test_whole_images_pass_and_truncated_ones_are_refused(fmt: str) -> None:
    raw = encoded(fmt)
    limits = ImageLimits(1 << 20, 100_000)
    assert check_image(raw, limits) == fmt
    for cut in (raw[: len(raw) // 2], raw[:-2] if fmt != "PNG" else raw[:-16]):
        with pytest.raises(ImageError, match="cannot be decoded"):
            check_image(cut, limits)


def test_png_bit_flips_and_pixel_bombs_are_refused_from_the_header() -> None:
    raw = bytearray(encoded("PNG"))
    raw[len(raw) // 2] ^= 0xFF
    with pytest.raises(ImageError, match="cannot be decoded"):
        check_image(bytes(raw), ImageLimits(1 << 20, 100_000))
    bomb = io.BytesIO()
    Image.new("L", (20_000, 20_000)).save(bomb, "PNG")  # ~400 MP in about 0.5 MB
    with pytest.raises(ImageError, match="limit is 100000 pixels"):
        check_image(bomb.getvalue(), ImageLimits(1 << 20, 100_000))


def test_formats_outside_the_list_are_refused() -> None:
    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, "PPM")
    with pytest.raises(ImageError, match="not one of PNG"):
        check_image(out.getvalue(), ImageLimits(1 << 20, 100_000))
