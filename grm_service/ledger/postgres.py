"""A ledger shared by several gateways: one PostgreSQL table, through psycopg 3.

psycopg 3 because it is the maintained PostgreSQL driver (psycopg2 only gets fixes), ships
binary wheels with libpq (`psycopg[binary]`: nothing to build), is typed (mypy reads its
connection and cursor types), and its errors are a typed tree. A flush is one batch's row, its
tag lines and lookups, in one transaction: a few round trips whatever its size. It is an
optional extra (`grm-service[postgres]`), imported only when a postgresql:// ledger is asked for.

A connection that fails (the server restarted, the network went) is dropped and reopened at the
next call; until then each call raises `LedgerUnavailable`, which the writer counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg

from grm_service.errors import LedgerUnavailable
from grm_service.ledger.store import Run, Store
from grm_service.ledger.upgrade import move_rows

T = TypeVar("T")

# Two gateways that start at once would race on CREATE TABLE IF NOT EXISTS: the schema's
# transaction holds this advisory lock.
_SCHEMA_LOCK = 0x6772_6D6C  # "grml"
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS ledger_batches (
  id BIGINT PRIMARY KEY, records INTEGER NOT NULL, first_at DOUBLE PRECISION NOT NULL,
  last_at DOUBLE PRECISION NOT NULL, size BIGINT NOT NULL, digests TEXT NOT NULL,
  ends BYTEA NOT NULL, data BYTEA NOT NULL)""",
    # Not compressed: a record is read by `substring` of the blob, which a compressed value
    # would decompress whole for; and the writer's batch costs the server no compression.
    # Only where the column is not so yet: the ALTER takes the table's exclusive lock, which
    # a gateway starting beside busy ones would wait for behind every open read.
    """DO $$ BEGIN
  IF (SELECT attstorage FROM pg_attribute WHERE attrelid = 'ledger_batches'::regclass
      AND attname = 'data') <> 'e' THEN
    ALTER TABLE ledger_batches ALTER COLUMN data SET STORAGE EXTERNAL;
  END IF;
END $$""",
    """CREATE TABLE IF NOT EXISTS ledger_tags (
  batch BIGINT NOT NULL, key_id TEXT NOT NULL, run TEXT NOT NULL, step BIGINT,
  records INTEGER NOT NULL, cached INTEGER NOT NULL, first_at DOUBLE PRECISION NOT NULL,
  last_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS ledger_tags_batch ON ledger_tags (batch)",
    "CREATE TABLE IF NOT EXISTS ledger_lookup (record BIGINT PRIMARY KEY, key BIGINT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS ledger_lookup_key ON ledger_lookup (key, record)",
    """CREATE TABLE IF NOT EXISTS ledger_ids (
  one INTEGER PRIMARY KEY CHECK (one = 1), next BIGINT NOT NULL)""",
    "INSERT INTO ledger_ids (one, next) VALUES (1, 1) ON CONFLICT DO NOTHING",
)
_OLD_COLUMNS = ("SELECT column_name FROM information_schema.columns WHERE table_name = 'ledger' "
                "AND table_schema = current_schema()")
_CONNECT_TIMEOUT_S = 5


class PostgresStore(Store):
    placeholder = "%s"
    contains = "strpos({}, ?) > 0"

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._connect()

    def _where(self) -> str:
        # The URL may hold a password: messages name the database only.
        return "ledger " + self.url.rsplit("/", 1)[-1].split("?")[0]

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        try:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S)
            with conn.transaction(), conn.cursor() as cursor:
                run = self._runner(cursor)
                run("SELECT pg_advisory_xact_lock(?)", [_SCHEMA_LOCK])
                for statement in _SCHEMA:
                    run(statement, [])
                move_rows(run, {name for (name,) in run(_OLD_COLUMNS, [])})
        except psycopg.Error as err:
            raise LedgerUnavailable(f"{self._where()}: {err}") from err
        self._conn = conn
        return conn

    def _failed(self, err: psycopg.Error) -> LedgerUnavailable:
        if self._conn is not None and self._conn.broken:
            self._conn.close()
            self._conn = None
        return LedgerUnavailable(f"{self._where()}: {err}")

    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        conn = self._connect()
        try:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description is not None else []
        except psycopg.Error as err:
            raise self._failed(err) from err

    def _runner(self, cursor: psycopg.Cursor[tuple[Any, ...]]) -> Run:
        def run(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
            cursor.execute(self._sql(sql), params)
            return cursor.fetchall() if cursor.description is not None else []

        return run

    def _transaction(self, work: Callable[[Run], T]) -> T:
        conn = self._connect()
        try:
            with conn.transaction(), conn.cursor() as cursor:
                return work(self._runner(cursor))
        except psycopg.Error as err:
            raise self._failed(err) from err

    def _read_range(self, batch_id: int, start: int, length: int) -> bytes:
        rows = self.query("SELECT substring(data FROM ? FOR ?) FROM ledger_batches WHERE id = ?",
                          [start + 1, length, batch_id])
        if not rows:
            raise LedgerUnavailable(f"{self._where()}: batch {batch_id} was pruned meanwhile")
        return bytes(rows[0][0])

    def used_bytes(self) -> int:
        # The sizes of the live rows: the table's own size keeps deleted rows until a vacuum.
        return int(self._run("SELECT COALESCE(SUM(size), 0) FROM ledger_batches")[0][0])

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
