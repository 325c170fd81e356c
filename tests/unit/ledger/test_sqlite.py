"""What only the SQLite file promises: owner-only files, several writing processes."""

from __future__ import annotations

import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from grm_service.errors import LedgerUnavailable
from grm_service.ledger.sqlite import SqliteStore
from grm_service.ledger.store import Selection
from tests.unit.ledger.test_store import record

_WRITER = """
import sys
from grm_service.ledger.sqlite import SqliteStore
from tests.unit.ledger.test_store import record
store = SqliteStore(__import__("pathlib").Path(sys.argv[1]))
for batch in range(40):
    store.write([record(int(sys.argv[2]) * 10_000 + batch * 10 + i) for i in range(10)])
store.close()
"""


def test_the_file_and_its_wal_are_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "new" / "ledger.sqlite"
    store = SqliteStore(path)
    store.write([record(1)])
    for name in ("ledger.sqlite", "ledger.sqlite-wal", "ledger.sqlite-shm"):
        assert stat.S_IMODE((path.parent / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    store.close()


def test_an_existing_wider_file_is_narrowed(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    path.touch(mode=0o644)
    SqliteStore(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_processes_writing_at_once_lose_nothing(tmp_path: Path) -> None:
    """`serve --workers N`: each worker commits its batches to the one WAL file."""
    path = tmp_path / "ledger.sqlite"
    SqliteStore(path).close()
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(n)])
             for n in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    store = SqliteStore(path, readonly=True)
    assert len(store.records(Selection(), limit=5000)) == 3 * 400
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_reader_opens_without_creating(tmp_path: Path) -> None:
    with pytest.raises(LedgerUnavailable):
        SqliteStore(tmp_path / "absent.sqlite", readonly=True)
    assert not (tmp_path / "absent.sqlite").exists()


def test_a_lookup_reads_the_lookup_index(tmp_path: Path) -> None:
    """The plan of the statement `lookup` runs, as run: the key's index, not a scan."""
    store = SqliteStore(tmp_path / "l.sqlite")
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    store.lookup("grm-1", "req1", "/v1/chat/completions")
    store._db.set_trace_callback(None)
    [select] = [sql for sql in statements if sql.startswith("SELECT")]
    plan = store._db.execute("EXPLAIN QUERY PLAN " + select).fetchall()
    store.close()
    assert any("ledger_lookup_key" in str(row) for row in plan), plan


def test_a_new_file_has_pages_a_batch_fills(tmp_path: Path) -> None:
    """A batch's blob spans overflow pages, each written on its own: few large ones."""
    SqliteStore(tmp_path / "l.sqlite").close()
    with sqlite3.connect(tmp_path / "l.sqlite") as db:
        assert db.execute("PRAGMA page_size").fetchone() == (16384,)
