"""What only the PostgreSQL store does: its blob column's storage, set once."""

from __future__ import annotations

import threading

import psycopg

from grm_service.ledger.postgres import PostgresStore
from tests.unit.ledger.conftest import fresh_postgres

_STORAGE = ("SELECT attstorage FROM pg_attribute WHERE attrelid = 'ledger_batches'::regclass "
            "AND attname = 'data'")


def test_the_blob_is_stored_uncompressed(postgres_url: str) -> None:
    PostgresStore(fresh_postgres(postgres_url)).close()
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute(_STORAGE).fetchone() == ("e",)


def test_a_gateway_starts_beside_an_open_read(postgres_url: str) -> None:
    """A second connect leaves the schema as it is: no exclusive lock, so a read that holds the
    table (another gateway's page of records) does not hold the start up."""
    url = fresh_postgres(postgres_url)
    PostgresStore(url).close()
    opened: list[PostgresStore] = []
    with psycopg.connect(url) as reader:
        reader.execute("SELECT count(*) FROM ledger_batches").fetchall()  # its lock kept
        starting = threading.Thread(target=lambda: opened.append(PostgresStore(url)), daemon=True)
        starting.start()
        starting.join(timeout=20)
        started = bool(opened)
        reader.rollback()
    starting.join(timeout=20)
    for store in opened:
        store.close()
    assert started, "the second connect waited for the reader's transaction"
