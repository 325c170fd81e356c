"""A ledger of the earlier one-row-per-record layout, opened by this version: on a real SQLite
file and a real PostgreSQL server alike."""

from __future__ import annotations

import sqlite3

import psycopg

from grm_service.ledger.location import open_store
from grm_service.ledger.store import COLUMNS, Selection, row_values
from tests.unit.ledger.test_store import record

_FIRST_SCHEMA = {
    "sqlite": """CREATE TABLE ledger (
  id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, key_id TEXT NOT NULL,
  run TEXT NOT NULL, step INTEGER, route TEXT NOT NULL, path TEXT NOT NULL,
  fingerprint_id TEXT NOT NULL, request_digest TEXT NOT NULL, response_digest TEXT NOT NULL,
  body BLOB, payload BLOB NOT NULL, fields TEXT NOT NULL, cache TEXT NOT NULL,
  size INTEGER NOT NULL)""",
    "postgres": """CREATE TABLE ledger (
  id BIGSERIAL PRIMARY KEY, at DOUBLE PRECISION NOT NULL, key_id TEXT NOT NULL,
  run TEXT NOT NULL, step BIGINT, route TEXT NOT NULL, path TEXT NOT NULL,
  fingerprint_id TEXT NOT NULL, request_digest TEXT NOT NULL, response_digest TEXT NOT NULL,
  body BYTEA, payload BYTEA NOT NULL, fields TEXT NOT NULL, cache TEXT NOT NULL,
  size BIGINT NOT NULL)""",
}
_FIRST_ROW = ("INSERT INTO ledger (at, key_id, run, step, route, path, fingerprint_id, "
              "request_digest, response_digest, body, payload, fields, cache, size) VALUES "
              "(1.5, '', 'old', 3, '/v1/score', '/v1/chat/completions', 'grm-1', 'req0', "
              "'resp0', NULL, X'7b7d', '{\"fingerprint_id\": \"grm-1\"}', '', 402)")


def _first_schema_ledger(location: str) -> None:
    if location.startswith("postgresql://"):
        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute(_FIRST_SCHEMA["postgres"])
            conn.execute("CREATE INDEX ledger_request ON ledger (fingerprint_id, request_digest)")
            conn.execute(_FIRST_ROW.replace("X'7b7d'", "'{}'::bytea"))
        return
    with sqlite3.connect(location) as db:
        db.execute(_FIRST_SCHEMA["sqlite"])
        db.execute("CREATE INDEX ledger_request ON ledger (fingerprint_id, request_digest)")
        db.execute(_FIRST_ROW)


def test_a_ledger_of_the_first_schema_keeps_its_records(location: str) -> None:
    """Opened by this version: its records read back, are never answered from (they have no
    lookup key: a miss, not a wrong answer), and new ones are."""
    _first_schema_ledger(location)
    store = open_store(location)
    try:
        [old] = store.records(Selection())
        assert (old.origin.run, old.origin.step, old.request_digest) == ("old", 3, "req0")
        assert old.id == 1 and old.fields == {"fingerprint_id": "grm-1", "request_digest": "req0",
                                              "response_digest": "resp0"}
        assert store.lookup("grm-1", "req0", "/v1/chat/completions") is None
        store.write([record(1)])
        assert store.lookup("grm-1", "req1", "/v1/chat/completions") is not None
        assert [r.id for r in store.records(Selection())] == [1, 2]
    finally:
        store.close()
    open_store(location).close()  # opened again: nothing left to upgrade


def test_a_ledger_of_one_row_per_record_moves_into_batches(location: str) -> None:
    """The second schema (a lookup key per row): its records keep their ids (a gap where some
    were pruned), their bytes and their lookups; new ones follow the last id."""
    _first_schema_ledger(location)
    old = [record(n) for n in (1, 2, 3)]
    old[2].indexed = False
    values = [row_values(r) for r in old]
    marks = ", ".join(["%s" if location.startswith("postgresql://") else "?"] * 16)
    sql = f"INSERT INTO ledger (id, {', '.join(COLUMNS)}) VALUES ({marks})"
    alter = "ALTER TABLE ledger ADD COLUMN lookup BIGINT"
    if location.startswith("postgresql://"):
        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute(alter)
            for rid, v in zip((5, 6, 9), values, strict=True):
                conn.execute(sql, (rid, *v))
    else:
        with sqlite3.connect(location) as db:
            db.execute(alter)
            db.executemany(sql, [(rid, *v) for rid, v in zip((5, 6, 9), values, strict=True)])
    store = open_store(location)
    try:
        back = store.records(Selection())
        assert [r.id for r in back] == [1, 5, 6, 9]
        assert [(r.body, r.payload, r.fields) for r in back[1:]] == [
            (r.body, r.payload, r.fields) for r in old]
        found = store.lookup("grm-1", "req2", "/v1/chat/completions")
        assert found is not None and found.id == 6
        assert store.lookup("grm-1", "req3", "/v1/chat/completions") is None  # not indexed
        store.write([record(4)])
        assert [r.id for r in store.records(Selection())][-1] == 10
    finally:
        store.close()
