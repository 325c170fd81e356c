"""Seeded PNG images made in code (no imaging library): probes for the pooling canary, images for
the clip scorer's tests and benchmarks. The same arguments give the same bytes everywhere."""

from __future__ import annotations

import base64
import random
import struct
import zlib


def png(width: int, height: int, seed: int) -> bytes:
    """An RGB PNG of seeded noise over a seeded gradient: photographs compress about as badly."""
    rng = random.Random(seed)
    base = [rng.randrange(256) for _ in range(3)]
    rows = bytearray()
    for y in range(height):
        rows.append(0)  # filter type None
        noise = rng.randbytes(width * 3)
        for x in range(width):
            for c in range(3):
                rows.append((base[c] + (x + y) * (c + 1) + noise[3 * x + c] // 4) & 0xFF)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(bytes(rows), 6)) + _chunk(b"IEND", b""))


def png_data_url(width: int, height: int, seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png(width, height, seed)).decode("ascii")


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)
