"""The ledger's storage: one table, the same SQL on SQLite and PostgreSQL.

Every method runs on the caller's thread and blocks (the writer and the reader call them on
their own worker threads, never on the event loop). A failure of the store underneath (a full
disk, a database gone) is raised as `LedgerUnavailable`, whatever the library's error was.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grm_service.ledger.records import Origin, Record, fields_json, full_fields, record_size

COLUMNS = ("at", "key_id", "run", "step", "route", "path", "fingerprint_id", "request_digest",
           "response_digest", "body", "payload", "fields", "cache", "size", "lookup")
_BODY, _PAYLOAD, _SIZE = (COLUMNS.index(c) for c in ("body", "payload", "size"))
# An answer's JSON as stored where the engine's own bytes are not at hand: the options of the
# answers the gateway renders.
PAYLOAD_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_SELECT = "SELECT id, " + ", ".join(COLUMNS) + " FROM ledger"
# Deleted in chunks: one statement over millions of rows would hold the write lock for long.
_PRUNE_CHUNK = 2000
# Rows per INSERT statement: one statement per row costs a round of the driver (and a release
# and retake of the GIL) per row; 500 rows of 15 values stay under SQLite's 32766 parameters.
_INSERT_ROWS = 500


@dataclass(frozen=True)
class Selection:
    """Which records: all of them, or those of one key, run, step range, request."""

    key_id: str | None = None  # None: every key's (the operator's own tools)
    run: str | None = None  # None: any run; "": untagged requests
    first_step: int | None = None
    last_step: int | None = None
    request_digest: str | None = None

    def where(self) -> tuple[str, list[Any]]:
        terms: list[str] = ["1=1"]
        params: list[Any] = []
        for column, value in (("key_id", self.key_id), ("run", self.run),
                              ("request_digest", self.request_digest)):
            if value is not None:
                terms.append(f"{column} = ?")
                params.append(value)
        if self.first_step is not None:
            terms.append("step >= ?")
            params.append(self.first_step)
        if self.last_step is not None:
            terms.append("step <= ?")
            params.append(self.last_step)
        return " AND ".join(terms), params


def lookup_key(fingerprint_id: str, request_digest: str, path: str) -> int:
    """The cache's key as one signed 64-bit integer, the lookup index's only column.

    An index on the text columns themselves took each write to a random leaf page of an index
    several times this size (benchmarks/bench_ledger_store.py); a lookup still compares the three
    columns, so two keys that share this integer are told apart."""
    raw = "\x1f".join((fingerprint_id, request_digest, path)).encode()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big", signed=True)


def row(at: float, origin: Origin, path: str, digests: tuple[str, str, str], body: Any,
        payload: Any, fields: str, cache: str, indexed: bool) -> tuple[Any, ...]:
    """One record's values in `COLUMNS`' order. `digests`: fingerprint id, request and response
    digests. As the request path leaves it (`finished` makes it ready for the store, where the
    request path could not), `body` may be the canonical body's parts (an image request's long
    strings, not joined on the loop) and `payload` a dict: a tuple of atoms only is what the
    garbage collector stops walking while it waits for its write, which a record's objects
    cost every answer meanwhile (benchmarks/cpu_inprocess.py)."""
    fp_id, request_digest, response_digest = digests
    key = lookup_key(fp_id, request_digest, path) if indexed and not cache else None
    # A body of one piece and the engine's bytes (a chat answer's, nearly always) leave the
    # row finished, its size counted (never 0: `record_size` adds the columns'); a size of 0
    # is what `finished` completes on the writer's thread.
    final = (body is None or type(body) is bytes) and type(payload) is bytes
    size = record_size(body, payload) if final else 0
    return (at, origin.key_id, origin.run or "", origin.step, origin.route, path, fp_id,
            request_digest, response_digest, body, payload, fields, cache, size, key)


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


def row_values(record: Record) -> tuple[Any, ...]:
    return finished(row(record.at, record.origin, record.path,
                        (record.fingerprint_id, record.request_digest, record.response_digest),
                        record.body, record.payload, fields_json(record.fields), record.cache,
                        record.indexed))


def from_row(values: Sequence[Any]) -> Record:
    (rid, at, key, run, step, route, path, fp_id, req, resp, body, payload, fields, cache,
     _size, lookup) = values
    return Record(at, Origin(route, key, run or None, step), path, fp_id, req, resp,
                  None if body is None else bytes(body), bytes(payload),
                  full_fields(fields, fp_id, req, resp),
                  cache, rid, lookup is not None)


class Store(ABC):
    """One ledger table; `placeholder` is the driver's parameter mark."""

    placeholder = "?"

    @abstractmethod
    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (committed) and return its rows."""

    @abstractmethod
    def _run_all(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Run the statements in one transaction."""

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
        """`finished` rows, all of them or none (one transaction)."""
        marks = "(" + ", ".join("?" * len(COLUMNS)) + ")"
        statements = []
        for start in range(0, len(rows), _INSERT_ROWS):
            chunk = rows[start:start + _INSERT_ROWS]
            values = ", ".join([marks] * len(chunk))
            sql = f"INSERT INTO ledger ({', '.join(COLUMNS)}) VALUES {values}"
            statements.append((self._sql(sql), list(itertools.chain.from_iterable(chunk))))
        self._run_all(statements)

    def lookup(self, fingerprint_id: str, request_digest: str, path: str) -> Record | None:
        """The newest computed (not itself cached) answer to this request by this identity."""
        rows = self.query(f"{_SELECT} WHERE lookup = ? AND fingerprint_id = ? AND "
                          "request_digest = ? AND path = ? AND cache = '' ORDER BY id DESC "
                          "LIMIT 1", (lookup_key(fingerprint_id, request_digest, path),
                                      fingerprint_id, request_digest, path))
        return from_row(rows[0]) if rows else None

    def records(self, selection: Selection, limit: int = 1000, after: int = 0) -> list[Record]:
        """In the order they were answered, `limit` at a time after record id `after`."""
        where, params = selection.where()
        rows = self.query(f"{_SELECT} WHERE {where} AND id > ? ORDER BY id LIMIT ?",
                          [*params, after, limit])
        return [from_row(row) for row in rows]

    def record(self, record_id: int, key_id: str | None = None) -> Record | None:
        where, params = Selection(key_id=key_id).where()
        rows = self.query(f"{_SELECT} WHERE {where} AND id = ?", [*params, record_id])
        return from_row(rows[0]) if rows else None

    def runs(self, key_id: str | None = None) -> list[dict[str, Any]]:
        where, params = Selection(key_id=key_id).where()
        rows = self.query("SELECT run, COUNT(*), MIN(step), MAX(step), MIN(at), MAX(at), "
                          f"SUM(CASE WHEN cache = '' THEN 0 ELSE 1 END) FROM ledger WHERE {where} "
                          "GROUP BY run ORDER BY MIN(id)", params)
        return [{"run": run, "requests": int(n), "first_step": lo, "last_step": hi,
                 "first_at": first, "last_at": last, "cached": int(hits)}
                for run, n, lo, hi, first, last, hits in rows]

    def steps(self, run: str, key_id: str | None = None) -> list[dict[str, Any]]:
        where, params = Selection(key_id=key_id, run=run).where()
        rows = self.query(f"SELECT step, COUNT(*), MIN(at), MAX(at) FROM ledger WHERE {where} "
                          "GROUP BY step ORDER BY step", params)
        return [{"step": step, "requests": int(n), "first_at": first, "last_at": last}
                for step, n, first, last in rows]

    def prune(self, max_bytes: int, max_age_s: float, now: float | None = None) -> int:
        """Drop records past the age bound, then the oldest until the ledger fits `max_bytes`
        (to 90 % of it, so that it is not pruned again at the next write)."""
        cutoff = (time.time() if now is None else now) - max_age_s
        dropped = self._delete_older(cutoff)
        while self.used_bytes() > max_bytes:
            over = self.used_bytes() - int(max_bytes * 0.9)
            deleted = self._delete_oldest(over)
            if not deleted:
                break
            dropped += deleted
        return dropped

    def _delete_older(self, cutoff: float) -> int:
        """Records are written in time order: the old ones are those before the first young
        one, found from the oldest on (no index on `at` to keep up on every insert)."""
        young = self.query("SELECT id FROM ledger WHERE at >= ? ORDER BY id LIMIT 1", [cutoff])
        dropped = 0
        while True:
            where = "id < ?" if young else "1=1"
            rows = self.query(f"SELECT id FROM ledger WHERE {where} ORDER BY id LIMIT ?",
                              [*([young[0][0]] if young else []), _PRUNE_CHUNK])
            if not rows:
                return dropped
            self.query("DELETE FROM ledger WHERE id <= ?", [rows[-1][0]])
            dropped += len(rows)

    def _delete_oldest(self, over: int) -> int:
        """Delete the oldest records whose sizes add up to `over` bytes (one chunk at most)."""
        rows = self.query("SELECT id, size FROM ledger ORDER BY id LIMIT ?", [_PRUNE_CHUNK])
        total, last = 0, None
        for rid, size in rows:
            total, last = total + int(size), rid
            if total >= over:
                break
        if last is None:
            return 0
        self.query("DELETE FROM ledger WHERE id <= ?", [last])
        return sum(1 for rid, _ in rows if rid <= last)

