"""crc32, zlib's (the same polynomial, the same values), at ISA-L's speed for large inputs.

The gateway takes crc32 of whole request bodies (the route digest of the canonical body) and of
the images inside them (every PNG chunk's CRC). ISA-L (python-isal) is ~3x zlib's speed on
such inputs (`benchmarks/bench_images.py`: 0.91 -> 0.29 ms for 2.7 MB); on a few hundred
bytes its call costs more than zlib's, so inputs below `LARGE` stay with zlib. Where isal has
no wheel, zlib computes every value (`tests/unit/test_checksum.py` holds both to zlib).
"""

from __future__ import annotations

import zlib

try:
    from isal.isal_zlib import crc32 as _large_crc32
except ImportError:  # no wheel for this platform
    _large_crc32 = zlib.crc32

LARGE = 4096


def crc32(data: bytes | memoryview, value: int = 0) -> int:
    """zlib.crc32(data, value), computed by ISA-L for a large input."""
    return (_large_crc32 if len(data) >= LARGE else zlib.crc32)(data, value)
