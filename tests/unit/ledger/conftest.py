from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from grm_service.ledger.location import open_store
from grm_service.ledger.store import Store
from tests.support.postgres import postgres_server


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """One real PostgreSQL server for the session's ledger tests."""
    with postgres_server() as url:
        yield url


def fresh_postgres(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS ledger, ledger_batches, ledger_tags, ledger_lookup, "
                     "ledger_ids")
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same suite on both stores: a new SQLite file, or an emptied PostgreSQL table."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite")
    return fresh_postgres(request.getfixturevalue("postgres_url"))


@pytest.fixture
def store(location: str) -> Iterator[Store]:
    opened = open_store(location)
    yield opened
    opened.close()
