"""A flush's records as the store keeps them: one row per batch, its records packed in one blob.

A row per record cost each record a B-tree insert, its index entries and its pages written
twice (the WAL, then the checkpoint). One blob per batch is one insert and a sequential write:
`Store.write` per chat record, 3.4 us of CPU against 6.0 (benchmarks/bench_ledger_store.py).
What the queries select on is kept beside the blob, small:

- `tags`: per batch, one line per (key id, run, step) it holds, with counts and times (the runs
  and steps views, and which batches a selection reads);
- `digests`: the batch's request digests, one per line (finding the request behind a reward
  without an index entry per record);
- `ends`: where each record ends in the blob (one record is read without decoding the others),
  after the texts its records share (`Index`);
- `lookups`: the records the cache may answer, by their 64-bit `store.lookup_digest`.

A record is its values in `COLUMNS`' order, msgpack-encoded (msgspec): floats, integers, text and
bytes come back exactly as written. Record ids are the batch's first id plus the record's place.

The texts that repeat from record to record (one key, one run, one route, one replica's
fingerprint text) are written once per batch, and a record holds each one's place in that list:
the writer's cost is about its bytes (each is copied into the blob, the WAL and the file).
`benchmarks/bench_ledger_store.py`'s chat record: 1,088 bytes against 1,362 inline. A batch
written before keeps its texts inline and reads the same (its `ends` has no texts).
"""

from __future__ import annotations

import array
import itertools
import operator
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

COLUMNS = ("at", "key_id", "run", "step", "route", "path", "fingerprint_id", "request_digest",
           "response_digest", "body", "payload", "fields", "cache", "size", "lookup")
_AT, _REQUEST, _CACHE, _SIZE, _LOOKUP = (
    COLUMNS.index(c) for c in ("at", "request_digest", "cache", "size", "lookup"))
_TAGS = operator.itemgetter(*(COLUMNS.index(c) for c in ("key_id", "run", "step")))
# A batch's blob stays well under what either database takes in one value (1 GB), and one read
# of a record's batch (a page of the CLI's listing) stays small.
MAX_BATCH_BYTES = 16 << 20
MAX_BATCH_RECORDS = 4096
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()
# The columns of `_shared`, whose values are the batch's texts: text in every record ever written.
_SHARED = tuple(COLUMNS.index(c) for c in ("key_id", "run", "route", "path", "fingerprint_id",
                                           "fields"))
# `ends` that begins with this word holds the batch's texts first. A record's end, a uint32, is
# below it (a request body is bounded far under 4 GiB): an earlier batch's `ends` never begins so.
_TEXTS_MARK = 0xFFFFFFFF


@dataclass(frozen=True)
class Tag:
    """The records of one (key id, run, step) in a batch."""

    key_id: str
    run: str
    step: int | None
    records: int
    cached: int
    first_at: float
    last_at: float


@dataclass(frozen=True)
class Batch:
    records: int
    first_at: float
    last_at: float
    size: int  # what its records count against the ledger's bound (`record_size`)
    digests: str
    ends: bytes
    data: bytes
    tags: tuple[Tag, ...]
    lookups: tuple[tuple[int, int], ...]  # (place in the batch, lookup digest)


def split(rows: Sequence[tuple[Any, ...]]) -> Iterator[Sequence[tuple[Any, ...]]]:
    """`finished` rows in batches within the bounds above, in order."""
    start, size = 0, 0
    for i, values in enumerate(rows):
        size += values[_SIZE]
        if i > start and (size > MAX_BATCH_BYTES or i - start >= MAX_BATCH_RECORDS):
            yield rows[start:i]
            start, size = i, values[_SIZE]
    if start < len(rows):
        yield rows[start:]


def pack(rows: Sequence[tuple[Any, ...]]) -> Batch:
    """One batch of `finished` rows (at least one)."""
    data, ends = bytearray(), array.array("I")
    texts: dict[str, int] = {}
    for values in rows:
        _ENCODER.encode_into(_shared(values, texts), data, -1)
        ends.append(len(data))
    times = [values[_AT] for values in rows]
    lookups = tuple((i, values[_LOOKUP]) for i, values in enumerate(rows)
                    if values[_LOOKUP] is not None)
    return Batch(len(rows), min(times), max(times), sum(values[_SIZE] for values in rows),
                 "\n".join([values[_REQUEST] for values in rows]), _index(ends, list(texts)),
                 bytes(data), _tags(rows), lookups)


def _shared(values: tuple[Any, ...], texts: dict[str, int]) -> tuple[Any, ...]:
    """The row as its batch holds it: each `_SHARED` text replaced by its place in `texts`
    (added where new). Spelled out in `COLUMNS`' order: this runs for every record written."""
    (at, key_id, run, step, route, path, fp_id, request, response, body, payload, fields, cache,
     size, lookup) = values
    place = texts.setdefault
    return (at, place(key_id, len(texts)), place(run, len(texts)), step,
            place(route, len(texts)), place(path, len(texts)), place(fp_id, len(texts)),
            request, response, body, payload, place(fields, len(texts)), cache, size, lookup)


def _index(ends: array.array[int], texts: list[str]) -> bytes:
    """`ends` as stored: the mark, the texts' length and the texts (msgpack), the ends."""
    shared = _ENCODER.encode(texts)
    head = array.array("I", [_TEXTS_MARK, len(shared)])
    return _little(head).tobytes() + shared + _little(ends).tobytes()


def _tags(rows: Sequence[tuple[Any, ...]]) -> tuple[Tag, ...]:
    """Records come in runs of one tag (a trainer's step), so `groupby` meets each run once."""
    found: dict[tuple[str, str, int | None], list[Any]] = {}
    for tags, group in itertools.groupby(rows, _TAGS):
        members = list(group)
        times = [values[_AT] for values in members]
        cached = sum(1 for values in members if values[_CACHE])
        seen = found.get(tags)
        if seen is None:
            found[tags] = [len(members), cached, min(times), max(times)]
        else:
            seen[0] += len(members)
            seen[1] += cached
            seen[2], seen[3] = min(seen[2], *times), max(seen[3], *times)
    return tuple(Tag(*tags, *counts) for tags, counts in found.items())


def _little(ends: array.array[int]) -> array.array[int]:
    """`ends` as stored, little-endian whatever the host (a swap is its own inverse)."""
    if sys.byteorder == "big":
        ends.byteswap()
    return ends


@dataclass(frozen=True)
class Index:
    """A batch's `ends` read: where each record starts and where the last one ends
    (`len(records) + 1` offsets), and the texts its records share (none: a batch written
    before, its texts inline)."""

    offsets: list[int]
    texts: list[str]

    @classmethod
    def of(cls, ends: bytes) -> Index:
        head = array.array("I")
        head.frombytes(ends[:8])
        _little(head)
        texts: list[str] = []
        if len(head) == 2 and head[0] == _TEXTS_MARK:
            texts = _DECODER.decode(ends[8:8 + head[1]])
            ends = ends[8 + head[1]:]
        found = array.array("I")
        found.frombytes(ends)
        return cls([0, *_little(found)], texts)

    def values(self, raw: bytes | memoryview) -> list[Any]:
        """One record's values, from its bytes in the blob."""
        values: list[Any] = _DECODER.decode(raw)
        texts = self.texts
        if texts:
            for column in _SHARED:
                values[column] = texts[values[column]]
        return values


def unpack(data: bytes | memoryview, ends: bytes, skip: int = 0) -> list[list[Any]]:
    """The records of a batch from its `skip`-th on, their values in `COLUMNS`' order."""
    view, index = memoryview(data), Index.of(ends)
    return [index.values(view[a:b]) for a, b in itertools.pairwise(index.offsets[skip:])]
