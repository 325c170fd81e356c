"""Which store a ledger location names, and whether it can work at all."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from grm_service.errors import LedgerNotMoved, LedgerUnavailable
from grm_service.ledger.sqlite import SqliteStore
from grm_service.ledger.store import Store

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
# What to do about a location that can never work: the service refuses to start on it.
_FIX = ("name a file in a writable folder (GRM_LEDGER_URL), or turn the ledger off "
        "(GRM_LEDGER=false)")
# An OS error's reason, in the words of what to change.
_REASONS = {
    errno.EISDIR: "it is a folder, not a file",
    errno.ENOTDIR: "a part of its path is a file, not a folder",
    errno.EEXIST: "a part of its path is a file, not a folder",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "the file system is read-only",
    errno.ENOENT: "its folder cannot be made there",
}


def open_store(location: str, readonly: bool = False) -> Store:
    """`postgresql://...` (or `postgres://`): the shared store; anything else a SQLite file
    (`readonly`: opened without creating it, for the tools that only read)."""
    if location.startswith(POSTGRES_SCHEMES):
        from grm_service.ledger.postgres import PostgresStore  # the optional extra

        return PostgresStore(location)
    return SqliteStore(sqlite_path(location), readonly)


def sqlite_path(location: str) -> Path:
    return Path(location.removeprefix("sqlite://")).expanduser()


def check_location(location: str) -> None:
    """Refuse a location that can never work, before anything starts (`LedgerUnavailable`,
    naming it and why): a served answer is never failed for its record, so a service on it
    would answer and drop every record. A SQLite file is opened as the writer opens it (made
    where there is none, its tables created: the folder and the file are proven writable). A
    postgresql:// ledger needs its driver; its database is not reached here: one that is down
    at start-up may come back, and the writer counts what it drops meanwhile."""
    if location.startswith(POSTGRES_SCHEMES):
        try:
            import grm_service.ledger.postgres  # noqa: F401
        except ImportError as err:
            raise LedgerUnavailable(
                f"ledger {shown(location)}: its driver is not installed ({err}); pip install "
                "'grm-service[postgres]', or turn the ledger off (GRM_LEDGER=false)") from err
        return
    path = sqlite_path(location)
    try:
        open_store(location).close()
    except LedgerUnavailable as err:
        raise LedgerUnavailable(f"ledger {path} cannot be used: {_reason(err)}; {_FIX}") from err


def _reason(err: LedgerUnavailable) -> str:
    cause = err.__cause__
    if isinstance(cause, OSError) and cause.errno in _REASONS:
        return f"{_REASONS[cause.errno]} ({cause.strerror})"
    if isinstance(cause, sqlite3.DatabaseError) and "not a database" in str(cause):
        return "it is not a SQLite file (file is not a database)"
    return str(cause or err.message)


def shown(location: str) -> str:
    """A location fit to show: a postgresql:// URL without its credentials."""
    scheme, sep, rest = location.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else location


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
