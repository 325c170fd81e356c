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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from grm_service.errors import LedgerNotMoved, LedgerUnavailable
from grm_service.ledger.store import Run, Store
from grm_service.ledger.upgrade import move_rows

T = TypeVar("T")

_SCHEMA = (
    # Its first record's id; `data` last, so that a scan of the others reads no blob page.
    """CREATE TABLE IF NOT EXISTS ledger_batches (
  id INTEGER PRIMARY KEY, records INTEGER NOT NULL, first_at REAL NOT NULL,
  last_at REAL NOT NULL, size INTEGER NOT NULL, digests TEXT NOT NULL, ends BLOB NOT NULL,
  data BLOB NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS ledger_tags (
  batch INTEGER NOT NULL, key_id TEXT NOT NULL, run TEXT NOT NULL, step INTEGER,
  records INTEGER NOT NULL, cached INTEGER NOT NULL, first_at REAL NOT NULL,
  last_at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS ledger_tags_batch ON ledger_tags (batch)",
    "CREATE TABLE IF NOT EXISTS ledger_lookup (record INTEGER PRIMARY KEY, key INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS ledger_lookup_key ON ledger_lookup (key)",
    """CREATE TABLE IF NOT EXISTS ledger_ids (
  one INTEGER PRIMARY KEY CHECK (one = 1), next INTEGER NOT NULL)""",
    "INSERT INTO ledger_ids (one, next) VALUES (1, 1) ON CONFLICT DO NOTHING",
)
# A new file's pages: a batch's blob spans overflow pages, each written on its own (to the WAL,
# then by the checkpoint); with 16 KiB pages, a quarter as many (`Store.write` per chat record:
# 3.4 against 3.8 us of CPU with 4 KiB, benchmarks/bench_ledger_store.py). A file that exists
# keeps its page size.
_PAGE_SIZE = 16384
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
            if readonly:
                self._check_layout()
            else:
                self._db.execute(f"PRAGMA page_size = {_PAGE_SIZE}")
                self._db.execute("PRAGMA journal_mode = WAL")
                self._db.execute("PRAGMA synchronous = NORMAL")
                self._create()
                for suffix in _SIDE_FILES:
                    side = Path(f"{path}{suffix}")
                    if side.exists():
                        os.chmod(side, 0o600)
        except (sqlite3.Error, OSError) as err:
            raise LedgerUnavailable(f"ledger {path}: {err}") from err

    def _check_layout(self) -> None:
        """A reader opens without writing: a file of another layout is named as such."""
        tables = {name for (name,) in self._db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "ledger_batches" in tables:
            return
        if "ledger" in tables:
            raise LedgerNotMoved(
                f"ledger {self.path} is of an earlier layout (a row per record): a gateway of "
                "this version moves it into batches when it opens it, or run `grm-service "
                "ledger upgrade`")
        raise LedgerUnavailable(f"{self.path} holds no ledger")

    def _create(self) -> None:
        """The tables, and an earlier layout's records moved in, in one transaction:
        `--workers N` open the file at once."""

        def create(run: Run) -> None:
            for statement in _SCHEMA:
                run(statement, [])
            move_rows(run, {row[1] for row in run("PRAGMA table_info(ledger)", [])})

        self._transaction(create)

    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.Error as err:
            raise LedgerUnavailable(f"ledger {self.path}: {err}") from err

    def _transaction(self, work: Callable[[Run], T]) -> T:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                done = work(lambda sql, params: self._db.execute(sql, params).fetchall())
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as err:
            raise LedgerUnavailable(f"ledger {self.path}: {err}") from err
        return done

    def _read_range(self, batch_id: int, start: int, length: int) -> bytes:
        try:
            with self._db.blobopen("ledger_batches", "data", batch_id, readonly=True) as blob:
                blob.seek(start)
                return blob.read(length)
        except sqlite3.Error as err:
            raise LedgerUnavailable(f"ledger {self.path}: {err}") from err

    def used_bytes(self) -> int:
        pages = self._run("PRAGMA page_count")[0][0] - self._run("PRAGMA freelist_count")[0][0]
        return int(pages * self._run("PRAGMA page_size")[0][0])

    def close(self) -> None:
        self._db.close()
