"""A ledger of an earlier layout, moved into batches when a gateway opens it.

Earlier versions kept one row per record in a `ledger` table; the first schema had no `lookup`
column (its records are never answered from: a miss, not a wrong answer). Its records move into
batches in the same transaction that creates the tables, keeping their ids, and the table goes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from grm_service.ledger.batches import COLUMNS, pack, split
from grm_service.ledger.store import Run, insert

log = logging.getLogger(__name__)

_CHUNK = 2000


def move_rows(run: Run, columns: set[str]) -> int:
    """Move the `ledger` table's records (`columns`: the table's; empty: there is none)."""
    if not columns:
        return 0
    wanted = [c if c in columns else "NULL" for c in COLUMNS]
    select = f"SELECT id, {', '.join(wanted)} FROM ledger WHERE id > ? ORDER BY id LIMIT ?"
    after, moved = 0, 0
    while rows := run(select, [after, _CHUNK]):
        for part in _consecutive(rows):
            values = [tuple(_plain(v) for v in row[1:]) for row in part]
            start = int(part[0][0])
            for batch_rows in split(values):
                insert(run, pack(batch_rows), start)
                start += len(batch_rows)
        after, moved = int(rows[-1][0]), moved + len(rows)
    run("DROP TABLE ledger", [])
    run("UPDATE ledger_ids SET next = ? WHERE one = 1 AND next <= ?", [after + 1, after])
    log.info("ledger: %d record(s) of the earlier layout moved into batches", moved)
    return moved


def _plain(value: Any) -> Any:
    """A driver's buffer (PostgreSQL's bytea may come as a memoryview) as bytes."""
    return bytes(value) if isinstance(value, memoryview) else value


def _consecutive(rows: Sequence[tuple[Any, ...]]) -> list[Sequence[tuple[Any, ...]]]:
    """The rows in runs of consecutive ids: a batch's ids are its first id plus a place."""
    parts, start = [], 0
    for i in range(1, len(rows)):
        if rows[i][0] != rows[i - 1][0] + 1:
            parts.append(rows[start:i])
            start = i
    parts.append(rows[start:])
    return parts
