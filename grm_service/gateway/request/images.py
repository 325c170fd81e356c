"""Inline images: what the gateway proves about one before an engine sees it, at the cost of
reading its bytes once, not of decoding its pixels.

An engine decodes every image it is sent; the gateway's job is to make sure that decode is one
the operator agreed to pay for and one that will succeed. What each step proves:

- **base64** (pybase64, SIMD): the payload is canonical base64 and its decoded size is within
  `max_image_bytes`. It must be decoded to be checked at all; this is the one pass over the
  bytes that every request pays (about 0.1 ms for 2 MB; CPython's `base64` takes ~7 ms).
- **format** (magic bytes, Pillow restricted to `FORMATS`): the engine's Pillow would otherwise
  try every format it knows, including ones that start helper programs (EPS) or have a long
  history of decoder bugs.
- **dimensions** (the header: PNG's IHDR, JPEG's SOF, ...): width x height within
  `max_image_pixels`. This is the decompression-bomb check: the pixels an engine allocates and
  the image tokens it computes follow from the header, never from the compressed size, so a
  header read bounds them before anything is inflated.
- **framing**: the container is whole. PNG: every chunk's CRC-32 up to IEND (what Pillow's
  `verify` checks, with ISA-L's crc32 on views of the bytes: `checksum.py`), so a truncated
  upload or a flipped bit is caught; JPEG: an EOI
  marker after the start of scan; WebP and BMP: the size the header declares is present; GIF:
  the trailer; TIFF: every strip or tile lies inside the file.

What a header read does not prove: that the compressed pixel stream inside correct framing
inflates to valid pixels. Only a full decode proves that, at 10-30x the cost of everything above
for a page scan (`benchmarks/bench_images.py`). Such a file has to be built on purpose (valid
CRCs around a broken stream); the engine then fails to decode it and answers 4xx, which the
gateway passes through without failover, so a client gains nothing it could not get with a
valid image of the same size. Operators who want the proof anyway set `GRM_IMAGE_DECODE=true`.
"""

from __future__ import annotations

import binascii
import io
import re
import warnings
from dataclasses import dataclass

import pybase64
from PIL import Image, ImageFile, UnidentifiedImageError

from grm_service.checksum import crc32
from grm_service.errors import ImageError
from grm_service.mime import DATA_URL_PREFIX

FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif",
           "BMP": "image/bmp", "TIFF": "image/tiff"}
_CHUNK_TYPE = re.compile(rb"\w{4}")  # what Pillow takes for a chunk's type
_TIFF_OFFSETS = (273, 324)  # StripOffsets, TileOffsets
_TIFF_COUNTS = (279, 325)  # StripByteCounts, TileByteCounts


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int
    max_pixels: int
    decode: bool = False


def data_url_payload(url: str, raw: memoryview | None = None) -> str | memoryview:
    """The base64 part of `data:image/<type>;base64,<payload>`; ImageError for anything else.

    `raw`: the URL's UTF-8 bytes where they are at hand (the request body read): the payload
    of an ASCII URL is then a view of them, not a copy of megabytes of string.
    """
    comma = url.find(",")
    header = url if comma < 0 else url[:comma]
    media, _, encoding = header[len(DATA_URL_PREFIX):].partition(";")
    if comma < 0 or encoding.lower() != "base64":
        raise ImageError("image data URL must be base64-encoded: data:image/<type>;base64,...")
    if not media.lower().startswith("image/"):
        raise ImageError(f"data URL media type {media!r} is not an image type (image/png, ...)")
    if raw is not None and url.isascii():  # one byte per character: the offsets agree
        return raw[comma + 1:]
    return url[comma + 1:]


def decode_base64(payload: str | memoryview, max_bytes: int) -> bytes:
    """Canonical base64 -> bytes, refusing before decoding when the result would be too big."""
    if len(payload) // 4 * 3 > max_bytes + 2:
        size = len(payload) // 4 * 3
        raise ImageError(f"image is about {size} bytes; the limit is {max_bytes}")
    try:
        return pybase64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("image is not valid base64") from None


def check_image(data: bytes, limits: ImageLimits) -> str:
    """Prove what the module docstring says for these bytes; returns the format name."""
    if not data:
        raise ImageError("image is empty")
    if len(data) > limits.max_bytes:
        raise ImageError(f"image is {len(data)} bytes; the limit is {limits.max_bytes}")
    try:
        with warnings.catch_warnings():
            # Pillow warns about large or damaged files, then decides; the errors below say more.
            warnings.simplefilter("ignore")
            return _inspect(data, limits)
    except UnidentifiedImageError:
        raise ImageError(f"image cannot be decoded: not one of {', '.join(FORMATS)}") from None
    except Image.DecompressionBombError:
        raise ImageError(f"image has too many pixels; the limit is {limits.max_pixels} "
                         "pixels") from None
    except (OSError, SyntaxError, ValueError, EOFError, IndexError, KeyError, TypeError) as err:
        # Pillow reports a broken file through any of these, depending on the plugin.
        raise ImageError(f"image cannot be decoded: {err}") from None


def _inspect(data: bytes, limits: ImageLimits) -> str:
    with Image.open(io.BytesIO(data), formats=list(FORMATS)) as img:
        assert isinstance(img, ImageFile.ImageFile)  # what Image.open returns for a file
        width, height = img.size
        if width * height > limits.max_pixels:
            raise ImageError(f"image is {width}x{height} pixels; the limit is "
                             f"{limits.max_pixels} pixels")
        kind = str(img.format)
        _check_framing(kind, img, data)
    if limits.decode:
        with Image.open(io.BytesIO(data), formats=[kind]) as img:
            img.load()
    return kind


def _check_framing(kind: str, img: ImageFile.ImageFile, data: bytes) -> None:
    if kind == "PNG":
        _check_png_chunks(data, img.tile[0][2] - 8 if img.tile else 8)
    elif kind == "JPEG":
        scan = img.tile[0][2] if img.tile else 0
        if data.rfind(b"\xff\xd9") < scan:
            raise ImageError("image cannot be decoded: JPEG is truncated (no end-of-image marker)")
    elif kind == "GIF" and not data.rstrip(b"\0").endswith(b";"):
        raise ImageError("image cannot be decoded: GIF is truncated (no trailer)")
    elif kind == "WEBP" and int.from_bytes(data[4:8], "little") + 8 > len(data):
        raise ImageError("image cannot be decoded: WebP is shorter than its header says")
    elif kind == "BMP" and int.from_bytes(data[2:6], "little") > len(data):
        raise ImageError("image cannot be decoded: BMP is shorter than its header says")
    elif kind == "TIFF":
        _check_tiff(img, len(data))


def _check_png_chunks(data: bytes, start: int) -> None:
    """Every chunk from `start` (the first IDAT's: Pillow checked those before it as it read
    the header) is whole and its CRC-32 right, up to IEND, as Pillow's `verify` has it."""
    view = memoryview(data)
    pos = start
    while True:
        kind = data[pos + 4:pos + 8]
        if len(kind) < 4:
            raise ImageError("image cannot be decoded: truncated PNG file")
        if not _CHUNK_TYPE.fullmatch(kind):
            raise ImageError(f"image cannot be decoded: broken PNG file (chunk {kind!r})")
        if kind == b"IEND":
            return
        end = pos + 8 + int.from_bytes(data[pos:pos + 4], "big")
        if end + 4 > len(data):
            raise ImageError("image cannot be decoded: truncated PNG file")
        if crc32(view[pos + 4:end]) != int.from_bytes(data[end:end + 4], "big"):
            raise ImageError(f"image cannot be decoded: broken PNG file (bad checksum in "
                             f"{kind!r})")
        pos = end + 4


def _check_tiff(img: Image.Image, size: int) -> None:
    tags = img.tag_v2  # type: ignore[attr-defined]
    for offsets_tag, counts_tag in zip(_TIFF_OFFSETS, _TIFF_COUNTS, strict=True):
        offsets, counts = tags.get(offsets_tag), tags.get(counts_tag)
        if offsets is None:
            continue
        offsets = offsets if isinstance(offsets, tuple) else (offsets,)
        counts = counts if isinstance(counts, tuple) else (counts,) if counts else ()
        if len(offsets) != len(counts):
            raise ImageError("image cannot be decoded: TIFF strip table is inconsistent")
        if any(o + c > size for o, c in zip(offsets, counts, strict=True)):
            raise ImageError("image cannot be decoded: TIFF is shorter than its strips")
