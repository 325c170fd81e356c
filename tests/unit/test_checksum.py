"""`checksum.crc32` is zlib.crc32 at every size, whole and in parts, from ISA-L or not."""

from __future__ import annotations

import itertools
import platform
import random
import zlib

import pytest

from grm_service import checksum
from grm_service.gateway.request import router

SIZES = [0, 1, checksum.LARGE - 1, checksum.LARGE, 150_000, 1 << 21]


def _parts(data: bytes, seed: int) -> list[memoryview]:
    cuts = sorted(random.Random(seed).sample(range(len(data) + 1), min(len(data) + 1, 5)))
    return [memoryview(data)[a:b] for a, b in itertools.pairwise([0, *cuts, len(data)])]


@pytest.mark.parametrize("size", SIZES)
def test_crc32_is_zlibs_whole_and_in_parts(size: int) -> None:
    data = random.Random(size).randbytes(size)
    assert checksum.crc32(data) == zlib.crc32(data)
    assert checksum.crc32(data, 0xDEADBEEF) == zlib.crc32(data, 0xDEADBEEF)
    assert router.route_digest(data) == zlib.crc32(data)
    assert router.route_digest_of_parts(_parts(data, size)) == zlib.crc32(data)


@pytest.mark.parametrize("size", SIZES)
def test_without_isal_zlib_gives_the_same_values(
        size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checksum, "_large_crc32", zlib.crc32)
    data = random.Random(size).randbytes(size)
    assert router.route_digest_of_parts(_parts(data, size)) == zlib.crc32(data)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="isal's wheels")
def test_large_inputs_go_to_isal_where_it_has_a_wheel() -> None:
    from isal import isal_zlib

    assert checksum._large_crc32 is isal_zlib.crc32
