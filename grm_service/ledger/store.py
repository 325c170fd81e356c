"""The ledger's storage: batches of records (batches.py), the same SQL on SQLite and PostgreSQL.

    ledger_batches  a flush's records: one row, their values packed in one blob
    ledger_tags     per batch, its (key id, run, step) lines: the runs and steps views
    ledger_lookup   the records the cache may answer, by their 64-bit lookup digest (column `key`)
    ledger_ids      the next record id (one row: writers of several processes take turns on it)

Every method runs on the caller's thread and blocks (the writer and the reader call them on
their own worker threads, never on the event loop). A failure of the store underneath (a full
disk, a database gone) is raised as `LedgerUnavailable`, whatever the library's error was.
"""

from __future__ import annotations

import hashlib
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from grm_service.digits import INT64_MAX
from grm_service.ledger.batches import COLUMNS, Batch, Index, pack, split, unpack
from grm_service.ledger.records import (
    Origin,
    Record,
    fields_json,
    full_fields,
    record_size,
)

_BODY, _PAYLOAD, _SIZE = (COLUMNS.index(c) for c in ("body", "payload", "size"))
_KEY, _RUN, _STEP, _REQUEST = (COLUMNS.index(c) for c in ("key_id", "run", "step",
                                                          "request_digest"))
# An answer's JSON as stored where the engine's own bytes are not at hand: the options of the
# answers the gateway renders.
PAYLOAD_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
# Batches deleted per statement: one statement over a day of batches would hold the write lock
# for long.
_PRUNE_CHUNK = 64
# Rows per INSERT statement of the small tables: a round of the driver per row is what a batch
# saves; 500 rows stay under SQLite's 32766 parameters.
_INSERT_ROWS = 500
# A statement (with "?" marks) and its parameters, run in the store's open transaction.
Run = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]
T = TypeVar("T")


@dataclass(frozen=True)
class Selection:
    """Which records: all of them, or those of one key, run, step range, request."""

    key_id: str | None = None  # None: every key's (the operator's own tools)
    run: str | None = None  # None: any run; "": untagged requests
    first_step: int | None = None
    last_step: int | None = None
    request_digest: str | None = None

    def tag_terms(self) -> tuple[list[str], list[Any]]:
        """The terms on a batch's tag lines (`t`) that a batch holding a selected record meets."""
        terms: list[str] = []
        params: list[Any] = []
        for column, value in (("key_id", self.key_id), ("run", self.run)):
            if value is not None:
                terms.append(f"t.{column} = ?")
                params.append(value)
        if self.first_step is not None:
            terms.append("t.step >= ?")
            params.append(self.first_step)
        if self.last_step is not None:
            terms.append("t.step <= ?")
            params.append(self.last_step)
        return terms, params

    def matches(self, values: Sequence[Any]) -> bool:
        """Whether a record (its values, `COLUMNS`' order) is selected."""
        step = values[_STEP]
        return ((self.key_id is None or values[_KEY] == self.key_id)
                and (self.run is None or values[_RUN] == self.run)
                and (self.request_digest is None or values[_REQUEST] == self.request_digest)
                and (self.first_step is None or (step is not None and step >= self.first_step))
                and (self.last_step is None or (step is not None and step <= self.last_step)))


def lookup_digest(fingerprint_id: str, request_digest: str, path: str, scope: str = "") -> int:
    """A cache lookup (`cache.Lookup`) as one signed 64-bit integer: the lookup index's column.

    An index on the text columns themselves took each write to a random leaf page of an index
    several times this size (benchmarks/bench_ledger_store.py); a lookup still compares the
    columns, so two lookups that share this integer are told apart. The shared scope ("") hashes
    as the ledgers written before scopes did: their records are found where the cache is shared,
    and are missed (recomputed, never another key's) where it is per key."""
    parts = (fingerprint_id, request_digest, path, scope) if scope else (
        fingerprint_id, request_digest, path)
    raw = "\x1f".join(parts).encode()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big", signed=True)


def row(at: float, origin: Origin, path: str, digests: tuple[str, str, str], body: Any,
        payload: Any, fields: str, cache: str, scope: str | None) -> tuple[Any, ...]:
    """One record's values in `COLUMNS`' order. `digests`: fingerprint id, request and response
    digests. `scope`: the cache's scope its repeats are looked up in (`lookup_digest`); None where
    the cache never answers them (not in the lookup index). As the request path leaves it
    (`finished` makes it ready for the store, where the request path could not), `body` may be
    the canonical body's parts (an image request's long strings, not joined on the loop) and
    `payload` a dict: a tuple of atoms only is what the garbage collector stops walking while it
    waits for its write, which a record's objects cost every answer meanwhile
    (benchmarks/cpu_inprocess.py)."""
    fp_id, request_digest, response_digest = digests
    lookup = None if scope is None or cache else lookup_digest(fp_id, request_digest, path, scope)
    # A body of one piece and the engine's bytes (a chat answer's, nearly always) leave the
    # row finished, its size counted (never 0: `record_size` adds the columns'); a size of 0
    # is what `finished` completes on the writer's thread.
    final = (body is None or type(body) is bytes) and type(payload) is bytes
    size = record_size(body, payload) if final else 0
    return (at, origin.key_id, origin.run or "", origin.step, origin.route, path, fp_id,
            request_digest, response_digest, body, payload, fields, cache, size, lookup)


def finished(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """A `row` ready for the store (on the writer's thread): its body joined, its payload
    encoded, its size counted."""
    if values[_SIZE]:
        return values
    body, payload = values[_BODY], values[_PAYLOAD]
    if body is not None and not isinstance(body, bytes):
        body = b"".join(body)
    if not isinstance(payload, bytes):
        payload = PAYLOAD_JSON.encode(payload).encode()
    return (*values[:_BODY], body, payload, *values[_PAYLOAD + 1:_SIZE],
            record_size(body, payload), *values[_SIZE + 1:])


def row_values(record: Record, scope: str = "") -> tuple[Any, ...]:
    """`scope`: the cache's scope an indexed record is looked up in (`lookup_digest`)."""
    return finished(row(record.at, record.origin, record.path,
                        (record.fingerprint_id, record.request_digest, record.response_digest),
                        record.body, record.payload, fields_json(record.fields), record.cache,
                        scope if record.indexed else None))


def from_values(record_id: int, values: Sequence[Any]) -> Record:
    """A record as read back: its id and its values in `COLUMNS`' order."""
    (at, key, run, step, route, path, fp_id, req, resp, body, payload, fields, cache,
     _size, lookup) = values
    return Record(at, Origin(route, key, run or None, step), path, fp_id, req, resp,
                  None if body is None else bytes(body), bytes(payload),
                  full_fields(fields, fp_id, req, resp), cache, record_id, lookup is not None)


class Store(ABC):
    """The ledger's tables; `placeholder` is the driver's parameter mark, `contains` its
    substring test."""

    placeholder = "?"
    contains = "instr({}, ?) > 0"

    @abstractmethod
    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (committed) and return its rows."""

    @abstractmethod
    def _transaction(self, work: Callable[[Run], T]) -> T:
        """`work` in one transaction, given what runs a statement in it; all of it or none."""

    @abstractmethod
    def _read_range(self, batch_id: int, start: int, length: int) -> bytes:
        """`length` bytes of a batch's blob from `start`, without reading the rest."""

    @abstractmethod
    def used_bytes(self) -> int: ...

    @abstractmethod
    def close(self) -> None: ...

    def _sql(self, sql: str) -> str:
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._run(self._sql(sql), params)

    def write(self, records: Sequence[Record]) -> None:
        """All of them or none (one transaction)."""
        self.write_rows([row_values(r) for r in records])

    def write_rows(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """`finished` rows, all of them or none (one transaction). They are packed before the
        transaction: other processes wait only for the inserts."""
        batches = [pack(part) for part in split(rows)]

        def write(run: Run) -> None:
            for batch in batches:
                insert(run, batch, _allocate(run, batch))

        if batches:
            self._transaction(write)

    def lookup(self, fingerprint_id: str, request_digest: str, path: str,
               scope: str = "") -> Record | None:
        """The newest computed (not itself cached) answer to this request by this identity, in
        the cache's `scope` ("": any key's; else a key id: that key's own)."""
        rows = self.query("SELECT record FROM ledger_lookup WHERE key = ? ORDER BY record DESC",
                          [lookup_digest(fingerprint_id, request_digest, path, scope)])
        for (record_id,) in rows:  # one, but for a 64-bit collision
            found = self.record(record_id, scope or None)
            if found is not None and (found.fingerprint_id, found.request_digest, found.path,
                                      found.cache) == (fingerprint_id, request_digest, path, ""):
                return found
        return None

    def records(self, selection: Selection, limit: int = 1000, after: int = 0) -> list[Record]:
        """In the order they were answered, `limit` at a time after record id `after`."""
        found: list[Record] = []
        if after >= INT64_MAX:
            return found  # no id follows: and `after + 1` is past what the column holds
        lowest = self._batch_of(after + 1)
        where, params = self._batch_where(selection)
        while len(found) < limit:
            rows = self.query(f"SELECT b.id, b.ends, b.data FROM ledger_batches b WHERE b.id >= ? "
                              f"AND {where} ORDER BY b.id LIMIT 1", [lowest, *params])
            if not rows:
                break
            first, ends, data = rows[0]
            skip = max(0, after + 1 - first)  # the batch's records up to `after`: not decoded
            for place, values in enumerate(unpack(data, ends, skip), skip):
                if selection.matches(values):
                    found.append(from_values(first + place, values))
                    if len(found) == limit:
                        break
            lowest = first + 1
        return found

    def count(self, selection: Selection) -> int | None:
        """How many records are selected, from the tag lines (no blob read); None where the
        selection names a request digest, which the tag lines do not hold."""
        if selection.request_digest is not None:
            return None
        where, params = _tags_where(selection)
        rows = self.query(f"SELECT COALESCE(SUM(t.records), 0) FROM ledger_tags t WHERE {where}",
                          params)
        return int(rows[0][0])

    def _batch_of(self, record_id: int) -> int:
        """The id of the batch that holds (or would hold) `record_id`; 0 before the first."""
        rows = self.query("SELECT id FROM ledger_batches WHERE id <= ? ORDER BY id DESC LIMIT 1",
                          [record_id])
        return int(rows[0][0]) if rows else 0

    def _batch_where(self, selection: Selection) -> tuple[str, list[Any]]:
        terms, params = selection.tag_terms()
        where = ["1=1"]
        if terms:
            where.append("EXISTS (SELECT 1 FROM ledger_tags t WHERE t.batch = b.id AND "
                         + " AND ".join(terms) + ")")
        if selection.request_digest is not None:
            where.append(self.contains.format("b.digests"))
            params.append(selection.request_digest)
        return " AND ".join(where), params

    def record(self, record_id: int, key_id: str | None = None) -> Record | None:
        rows = self.query("SELECT id, records, ends FROM ledger_batches WHERE id <= ? "
                          "ORDER BY id DESC LIMIT 1", [record_id])
        if not rows or record_id - rows[0][0] >= rows[0][1]:
            return None
        first, _, ends = rows[0]
        place, index = record_id - first, Index.of(bytes(ends))
        at = index.offsets
        values = index.values(self._read_range(first, at[place], at[place + 1] - at[place]))
        if key_id is not None and values[_KEY] != key_id:
            return None
        return from_values(record_id, values)

    def runs(self, key_id: str | None = None) -> list[dict[str, Any]]:
        where, params = _tags_where(Selection(key_id=key_id))
        rows = self.query("SELECT t.run, SUM(t.records), MIN(t.step), MAX(t.step), "
                          "MIN(t.first_at), MAX(t.last_at), SUM(t.cached) FROM ledger_tags t "
                          f"WHERE {where} GROUP BY t.run ORDER BY MIN(t.batch)", params)
        return [{"run": run, "requests": int(n), "first_step": lo, "last_step": hi,
                 "first_at": first, "last_at": last, "cached": int(hits)}
                for run, n, lo, hi, first, last, hits in rows]

    def steps(self, run: str, key_id: str | None = None) -> list[dict[str, Any]]:
        where, params = _tags_where(Selection(key_id=key_id, run=run))
        rows = self.query("SELECT t.step, SUM(t.records), MIN(t.first_at), MAX(t.last_at) "
                          f"FROM ledger_tags t WHERE {where} GROUP BY t.step ORDER BY t.step",
                          params)
        return [{"step": step, "requests": int(n), "first_at": first, "last_at": last}
                for step, n, first, last in rows]

    def prune(self, max_bytes: int, max_age_s: float, now: float | None = None) -> int:
        """Drop records past the age bound, then the oldest until the ledger fits `max_bytes`
        (to 90 % of it, so that it is not pruned again at the next write). A batch goes whole:
        it stays while its newest record is within the age bound."""
        cutoff = (time.time() if now is None else now) - max_age_s
        dropped = self._delete_older(cutoff)
        while self.used_bytes() > max_bytes:
            deleted = self._delete_oldest(self.used_bytes() - int(max_bytes * 0.9))
            if not deleted:
                break
            dropped += deleted
        return dropped

    def _delete_older(self, cutoff: float) -> int:
        """Batches are written in time order: the old ones are those before the first young
        one, found from the oldest on (no index on a time to keep up on every insert)."""
        young = self.query("SELECT id FROM ledger_batches WHERE last_at >= ? ORDER BY id LIMIT 1",
                           [cutoff])
        dropped = 0
        while True:
            where = "id < ?" if young else "1=1"
            rows = self.query(f"SELECT id, records FROM ledger_batches WHERE {where} ORDER BY id "
                              "LIMIT ?", [*([young[0][0]] if young else []), _PRUNE_CHUNK])
            if not rows:
                return dropped
            dropped += self._delete_through(rows[-1], sum(int(n) for _, n in rows))

    def _delete_oldest(self, over: int) -> int:
        """Delete the oldest batches whose sizes add up to `over` bytes (one chunk at most)."""
        rows = self.query("SELECT id, records, size FROM ledger_batches ORDER BY id LIMIT ?",
                          [_PRUNE_CHUNK])
        total, records, last = 0, 0, None
        for batch_id, n, size in rows:
            total, records, last = total + int(size), records + int(n), (batch_id, n)
            if total >= over:
                break
        return 0 if last is None else self._delete_through(last, records)

    def _delete_through(self, last: tuple[int, int], records: int) -> int:
        """Delete every batch up to `last` (its id and record count), its tags and lookups."""
        batch_id, n = last

        def delete(run: Run) -> None:
            run("DELETE FROM ledger_lookup WHERE record < ?", [batch_id + n])
            run("DELETE FROM ledger_tags WHERE batch <= ?", [batch_id])
            run("DELETE FROM ledger_batches WHERE id <= ?", [batch_id])

        self._transaction(delete)
        return records


def _tags_where(selection: Selection) -> tuple[str, list[Any]]:
    terms, params = selection.tag_terms()
    return " AND ".join(["1=1", *terms]), params


def _allocate(run: Run, batch: Batch) -> int:
    """The batch's first record id: `ledger_ids` is one row, so that writers in several
    processes (or gateways) take turns on it within their transactions."""
    [(following,)] = run("UPDATE ledger_ids SET next = next + ? WHERE one = 1 RETURNING next",
                         [batch.records])
    return int(following) - batch.records


def insert(run: Run, batch: Batch, first: int) -> None:
    """One batch, its first record's id `first`, with its tags and lookups."""
    run("INSERT INTO ledger_batches (id, records, first_at, last_at, size, digests, ends, data) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [first, batch.records, batch.first_at, batch.last_at,
                                            batch.size, batch.digests, batch.ends, batch.data])
    tags = [(first, t.key_id, t.run, t.step, t.records, t.cached, t.first_at, t.last_at)
            for t in batch.tags]
    _insert_rows(run, "ledger_tags (batch, key_id, run, step, records, cached, first_at, "
                 "last_at)", tags)
    _insert_rows(run, "ledger_lookup (record, key)",
                 [(first + place, key) for place, key in batch.lookups])


def _insert_rows(run: Run, into: str, rows: Sequence[tuple[Any, ...]]) -> None:
    for start in range(0, len(rows), _INSERT_ROWS):
        chunk = rows[start:start + _INSERT_ROWS]
        marks = ", ".join(["(" + ", ".join("?" * len(chunk[0])) + ")"] * len(chunk))
        run(f"INSERT INTO {into} VALUES {marks}", [v for values in chunk for v in values])

