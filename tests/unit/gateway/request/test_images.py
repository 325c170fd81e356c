"""Image framing, by table: whole images pass, truncated, flipped, huge or unlisted ones are
refused from their bytes."""

from __future__ import annotations

import io
import random

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


def _pillow_verify_refuses(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data), formats=["PNG"]) as img:
            img.verify()
    except Exception:
        return True
    return False


def test_png_chunks_are_refused_exactly_where_pillows_verify_refuses_them() -> None:
    raw = encoded("PNG", (400, 300))  # several IDAT chunks
    rng = random.Random(7)
    cases = [raw[:cut] for cut in range(0, len(raw), max(1, len(raw) // 300))]
    for _ in range(300):
        flipped = bytearray(raw)
        flipped[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        cases.append(bytes(flipped))
    cases += [raw + b"trailing", raw[:-12] + raw[-12:].replace(b"IEND", b"IEN!")]
    limits = ImageLimits(1 << 22, 1 << 22)
    refused = 0
    for data in cases:
        try:
            check_image(data, limits)
            ours = False
        except ImageError:
            ours = True
        assert ours == _pillow_verify_refuses(data), data[:64]
        refused += ours
    assert 300 < refused < len(cases)  # both outcomes were tried
