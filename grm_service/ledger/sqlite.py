"""The embedded ledger: one SQLite file in WAL mode.

WAL lets every `serve --workers N` process write to the one file (writers take turns on its lock,
`busy_timeout` waits for it) while readers go on reading. `synchronous=NORMAL`: a committed batch
survives a crash of the process (a SIGKILL) and the file never corrupts; only a power loss can
take the last commits back. The file, its -wal and -shm are created owner-only (0600), its folder
0700 where it makes it.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grm_service.errors import LedgerUnavailable
from grm_service.ledger.store import Store

_TABLE = """
CREATE TABLE IF NOT EXISTS ledger (
  id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, key_id TEXT NOT NULL,
  run TEXT NOT NULL, step INTEGER, route TEXT NOT NULL, path TEXT NOT NULL,
  fingerprint_id TEXT NOT NULL, request_digest TEXT NOT NULL, response_digest TEXT NOT NULL,
  body BLOB, payload BLOB NOT NULL, fields TEXT NOT NULL, cache TEXT NOT NULL,
  size INTEGER NOT NULL, lookup INTEGER)"""
# A ledger of the first schema keeps its records; they were indexed by their text columns
# (`ledger_request`), have no `lookup` and are therefore never answered from (a miss, not a
# wrong answer).
_UPGRADE = ("ALTER TABLE ledger ADD COLUMN lookup INTEGER", "DROP INDEX IF EXISTS ledger_request")
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS ledger_lookup ON ledger (lookup) WHERE lookup IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS ledger_tags ON ledger (key_id, run, step)",
)
_SIDE_FILES = ("-wal", "-shm")


def _owner_only(path: Path) -> None:
    """Create the file 0600 before SQLite opens it: SQLite gives its -wal and -shm the
    database file's mode."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)  # a file that existed keeps no wider mode


class SqliteStore(Store):
    def __init__(self, path: Path, readonly: bool = False) -> None:
        self.path = path
        try:
            if readonly:
                self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True,
                                           check_same_thread=False, isolation_level=None)
            else:
                _owner_only(path)
                self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA busy_timeout = 10000")
            if not readonly:
                self._db.execute("PRAGMA journal_mode = WAL")
                self._db.execute("PRAGMA synchronous = NORMAL")
                self._create()
                for suffix in _SIDE_FILES:
                    side = Path(f"{path}{suffix}")
                    if side.exists():
                        os.chmod(side, 0o600)
        except (sqlite3.Error, OSError) as err:
            raise LedgerUnavailable(f"ledger {path}: {err}") from err

    def _create(self) -> None:
        """The table and its indexes, in one transaction: `--workers N` open it at once."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute(_TABLE)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(ledger)")}
            for statement in (() if "lookup" in columns else _UPGRADE) + _INDEXES:
                self._db.execute(statement)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.Error as err:
            raise LedgerUnavailable(f"ledger {self.path}: {err}") from err

    def _run_all(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    self._db.execute(sql, params)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as err:
            raise LedgerUnavailable(f"ledger {self.path}: {err}") from err

    def used_bytes(self) -> int:
        pages = self._run("PRAGMA page_count")[0][0] - self._run("PRAGMA freelist_count")[0][0]
        return int(pages * self._run("PRAGMA page_size")[0][0])

    def close(self) -> None:
        self._db.close()
