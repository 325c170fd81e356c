"""Which store a ledger location names."""

from __future__ import annotations

from pathlib import Path

from grm_service.errors import LedgerNotMoved, LedgerUnavailable
from grm_service.ledger.sqlite import SqliteStore
from grm_service.ledger.store import Store

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def open_store(location: str, readonly: bool = False) -> Store:
    """`postgresql://...` (or `postgres://`): the shared store; anything else a SQLite file
    (`readonly`: opened without creating it, for the tools that only read)."""
    if location.startswith(POSTGRES_SCHEMES):
        from grm_service.ledger.postgres import PostgresStore  # the optional extra

        return PostgresStore(location)
    return SqliteStore(Path(location.removeprefix("sqlite://")).expanduser(), readonly)


def open_reader(location: str) -> Store:
    """The gateway's reader (the cache's lookups, `GET /v1/ledger/...`). A SQLite file is opened
    read-only first: a writable open takes the file's write lock to make the tables, and another
    worker moving an earlier ledger into batches holds it for seconds, where a WAL reader need
    not wait (`LedgerNotMoved` until it is moved: a lookup misses). Where there is no ledger yet,
    it is made as the writer would."""
    if location.startswith(POSTGRES_SCHEMES):
        return open_store(location)
    try:
        return open_store(location, readonly=True)
    except LedgerNotMoved:
        raise
    except LedgerUnavailable:
        return open_store(location)
