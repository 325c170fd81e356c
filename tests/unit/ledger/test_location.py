"""`check_location`: a ledger location that can never work is refused before anything starts,
naming it and why; a good one is left ready for the writer."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest

from grm_service.errors import LedgerUnavailable
from grm_service.ledger.location import check_location, open_store
from grm_service.ledger.store import Selection
from tests.support.procs import free_port


def unwritable(tmp_path: Path) -> Path:
    """A place where no file can be made: a folder without write permission; as root, which
    writes there anyway, a system folder that refuses everyone."""
    if os.geteuid() == 0:
        return Path("/sys/grm-ledger.sqlite")
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o500)
    return folder / "ledger.sqlite"


def bad_locations(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Each location that can never work, and the reason its refusal gives."""
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "a-folder").mkdir()
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"\x7fELF" + bytes(range(256)) * 20)
    return {"under a file": (tmp_path / "a-file" / "ledger.sqlite", "is a file, not a folder"),
            "deeper under a file": (tmp_path / "a-file" / "sub" / "ledger.sqlite",
                                    "is a file, not a folder"),
            "a folder": (tmp_path / "a-folder", "it is a folder, not a file"),
            "garbage": (garbage, "not a SQLite file"),
            "unwritable": (unwritable(tmp_path), "")}


def test_each_location_that_can_never_work_is_refused_naming_it(tmp_path: Path) -> None:
    for name, (path, reason) in bad_locations(tmp_path).items():
        with pytest.raises(LedgerUnavailable) as refused:
            check_location(str(path))
        message = refused.value.message
        assert str(path) in message and reason in message, (name, message)
        assert "GRM_LEDGER=false" in message, message
    assert (tmp_path / "garbage.sqlite").read_bytes().startswith(b"\x7fELF")  # left as it was


def test_good_locations_pass_and_are_ready_for_the_writer(tmp_path: Path) -> None:
    new = tmp_path / "new" / "deeper" / "ledger.sqlite"
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    other_db = tmp_path / "other.sqlite"
    with sqlite3.connect(other_db) as db:
        db.execute("CREATE TABLE x (y)")
    for path in (new, empty, other_db):
        check_location(str(path))
        check_location(f"sqlite://{path}")
        store = open_store(str(path), readonly=True)  # its tables are there
        assert store.records(Selection()) == []
        store.close()
    assert new.stat().st_mode & 0o777 == 0o600


def test_a_postgres_location_is_not_reached_at_the_check() -> None:
    """A database down at start-up may come back: the writer counts what it drops meanwhile."""
    started = time.monotonic()
    check_location(f"postgresql://grm:secret@127.0.0.1:{free_port()}/none")
    assert time.monotonic() - started < 1
