"""A ledger shared by several gateways: one PostgreSQL table, through psycopg 3.

psycopg 3 because it is the maintained PostgreSQL driver (psycopg2 only gets fixes), ships
binary wheels with libpq (`psycopg[binary]`: nothing to build), is typed (mypy reads its
connection and cursor types), and its errors are a typed tree. A batch is a few multi-row
INSERTs in one transaction: a round trip per 500 records. It is an
optional extra (`grm-service[postgres]`), imported only when a postgresql:// ledger is asked for.

A connection that fails (the server restarted, the network went) is dropped and reopened at the
next call; until then each call raises `LedgerUnavailable`, which the writer counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from grm_service.errors import LedgerUnavailable
from grm_service.ledger.store import Store

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS ledger (
  id BIGSERIAL PRIMARY KEY, at DOUBLE PRECISION NOT NULL, key_id TEXT NOT NULL,
  run TEXT NOT NULL, step BIGINT, route TEXT NOT NULL, path TEXT NOT NULL,
  fingerprint_id TEXT NOT NULL, request_digest TEXT NOT NULL, response_digest TEXT NOT NULL,
  body BYTEA, payload BYTEA NOT NULL, fields TEXT NOT NULL, cache TEXT NOT NULL,
  size BIGINT NOT NULL, lookup BIGINT)""",
    # A table of the first schema (sqlite.py says what becomes of its records).
    "ALTER TABLE ledger ADD COLUMN IF NOT EXISTS lookup BIGINT",
    "DROP INDEX IF EXISTS ledger_request",
    "CREATE INDEX IF NOT EXISTS ledger_lookup ON ledger (lookup) WHERE lookup IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS ledger_tags ON ledger (key_id, run, step)",
)
_CONNECT_TIMEOUT_S = 5


class PostgresStore(Store):
    placeholder = "%s"

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
            with conn.transaction():
                for statement in _SCHEMA:
                    conn.execute(statement)
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

    def _run_all(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        conn = self._connect()
        try:
            with conn.transaction(), conn.cursor() as cursor:
                for sql, params in statements:
                    cursor.execute(sql, params)
        except psycopg.Error as err:
            raise self._failed(err) from err

    def used_bytes(self) -> int:
        # The sizes of the live rows: the table's own size keeps deleted rows until a vacuum.
        return int(self._run("SELECT COALESCE(SUM(size), 0) FROM ledger")[0][0])

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
