"""Which store a ledger location names."""

from __future__ import annotations

from pathlib import Path

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
