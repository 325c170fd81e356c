"""A batch packed and read back: the same values, bit for bit; its tags, bounds and lookups;
its repeated texts written once; a batch of the earlier form (texts inline) read the same."""

from __future__ import annotations

import array
import sys
from typing import Any

import msgspec

from grm_service.ledger.batches import (
    COLUMNS,
    MAX_BATCH_BYTES,
    MAX_BATCH_RECORDS,
    Index,
    Tag,
    pack,
    split,
    unpack,
)

_SIZE = COLUMNS.index("size")


def values(n: int, *, run: str = "r", step: int | None = 0, cache: str = "", size: int = 500,
           lookup: int | None = None, at: float = 1.0) -> tuple[Any, ...]:
    return (at + n / 3, "key-a", run, step, "/v1/score", "/v1/chat/completions", "grm-1",
            f"req{n}", f"resp{n}", bytes(range(n % 256)) * 3 or None, b'{"n":%d}' % n,
            '{"seed":7,"e":"\\u00e9"}', cache, size, lookup)


def test_records_read_back_bit_for_bit_whole_or_one_at_a_time() -> None:
    rows = [values(n, step=2**63 - 1 if n == 3 else n, lookup=-(2**63) if n == 4 else None)
            for n in range(7)]
    batch = pack(rows)
    assert [tuple(v) for v in unpack(batch.data, batch.ends)] == rows
    index = Index.of(batch.ends)
    at = index.offsets
    assert len(at) == 8 and at[-1] == len(batch.data)
    assert tuple(index.values(batch.data[at[5]:at[6]])) == rows[5]
    assert batch.digests.split("\n") == [f"req{n}" for n in range(7)]
    assert (batch.records, batch.size) == (7, 3500)
    assert (batch.first_at, batch.last_at) == (1.0, 3.0)
    assert batch.lookups == ((4, -(2**63)),)


def test_tags_count_each_key_run_and_step_once() -> None:
    rows = [values(0, step=1), values(1, step=1, cache="hit"), values(2, step=2),
            values(3, step=1, at=-5.0), values(4, run="", step=None)]
    assert set(pack(rows).tags) == {
        Tag("key-a", "r", 1, 3, 1, -5.0 + 1, 1 + 1 / 3),
        Tag("key-a", "r", 2, 1, 0, 1 + 2 / 3, 1 + 2 / 3),
        Tag("key-a", "", None, 1, 0, 1 + 4 / 3, 1 + 4 / 3),
    }


def test_a_flush_is_split_within_the_bounds_in_order() -> None:
    many = [values(n) for n in range(2 * MAX_BATCH_RECORDS + 1)]
    assert [len(p) for p in split(many)] == [MAX_BATCH_RECORDS, MAX_BATCH_RECORDS, 1]
    big = [values(n, size=MAX_BATCH_BYTES // 2 + 1) for n in range(3)]
    parts = list(split(big))
    assert [len(p) for p in parts] == [1, 1, 1]
    huge = [values(0, size=3 * MAX_BATCH_BYTES)]
    assert [len(p) for p in split(huge)] == [1]  # one record is one batch, whatever its size
    assert [v for p in split(many) for v in p] == many
    assert list(split([])) == []
    assert all(sum(v[_SIZE] for v in p) <= MAX_BATCH_BYTES or len(p) == 1 for p in parts)


def test_texts_that_repeat_are_written_once_per_batch() -> None:
    rows = [values(n, run="run-" + "x" * 200) for n in range(50)]
    batch = pack(rows)
    assert batch.data.count(b"run-" + b"x" * 200) == 0
    assert batch.ends.count(b"run-" + b"x" * 200) == 1
    assert [tuple(v) for v in unpack(batch.data, batch.ends)] == rows
    inline = b"".join(msgspec.msgpack.encode(row) for row in rows)
    assert len(batch.data) < len(inline) - 49 * 200


def test_a_batch_of_the_earlier_form_reads_the_same() -> None:
    """Texts inline in each record, `ends` only the records' ends: what earlier versions wrote."""
    rows = [values(n, run="r" if n % 2 else "s") for n in range(1, 6)]
    data, ends = bytearray(), array.array("I")
    for row in rows:
        data += msgspec.msgpack.encode(row)
        ends.append(len(data))
    if sys.byteorder == "big":
        ends.byteswap()
    assert [tuple(v) for v in unpack(bytes(data), ends.tobytes())] == rows
    assert [tuple(v) for v in unpack(bytes(data), ends.tobytes(), skip=3)] == rows[3:]
    index = Index.of(ends.tobytes())
    assert index.texts == [] and index.offsets[-1] == len(data)
