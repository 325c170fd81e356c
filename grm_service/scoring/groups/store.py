"""The open groups of one service: one SQLite file (WAL) that every worker of the service shares.

    held_groups   a group: its size, when it opened, its state, the claim on it (who judges it,
                  until when), its outcome (the results by item id, or the error every member
                  gets), and `seq`, the change count of its last write
    held_members  a group's items as they came: id, the digest of the item, the item's JSON
    held_clock    one row: the change count every write moves on (`seq`)

The members live here, not in a process: a worker that restarts, or another worker, finds them.
One process makes every call of its `GroupStore` on one thread (held.py's executor); the file's
lock makes each call one transaction among every process's. `BEGIN IMMEDIATE` takes the write
lock at the start, so two writers never both read and then fail to upgrade.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from grm_service.errors import ServiceUnavailable, TooManyGroups

T = TypeVar("T")

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS held_groups (
  grp TEXT PRIMARY KEY, label TEXT NOT NULL, size INTEGER NOT NULL, opened REAL NOT NULL,
  state TEXT NOT NULL, claimer TEXT, lease_until REAL NOT NULL DEFAULT 0, results TEXT,
  error TEXT, finished REAL, seq INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS held_groups_open ON held_groups (state, opened)",
    "CREATE INDEX IF NOT EXISTS held_groups_seq ON held_groups (seq)",
    """CREATE TABLE IF NOT EXISTS held_members (
  grp TEXT NOT NULL, id TEXT NOT NULL, digest TEXT NOT NULL, item TEXT NOT NULL,
  arrived REAL NOT NULL, PRIMARY KEY (grp, id)) WITHOUT ROWID""",
    "CREATE TABLE IF NOT EXISTS held_clock (one INTEGER PRIMARY KEY CHECK (one = 1), n INTEGER)",
    "INSERT INTO held_clock (one, n) VALUES (1, 0) ON CONFLICT DO NOTHING",
)
# Groups that count against GRM_GROUP_MAX_OPEN: filling and not yet timed out, or being judged
# under a live claim. A group whose waiters all went away stops counting when it times out.
_LIVE = ("(state = 'open' AND opened > :now - :timeout) "
         "OR (state = 'claimed' AND lease_until > :now)")
# Groups nobody will ask about again: finished and kept their while, or abandoned that long.
_STALE = ("(state IN ('done', 'failed') AND finished < :now - :keep) "
          "OR (state = 'open' AND opened < :now - :timeout - :keep) "
          "OR (state = 'claimed' AND lease_until < :now - :timeout - :keep)")
_COUNT = "(SELECT count(*) FROM held_members m WHERE m.grp = held_groups.grp)"


class State(StrEnum):
    OPEN = "open"  # filling, or full and not yet claimed
    CLAIMED = "claimed"  # one waiter judges it, under a lease
    DONE = "done"  # its results are kept for retries
    FAILED = "failed"  # timed out or its judging failed: every member gets `error`


@dataclass(frozen=True)
class Member:
    id: str
    digest: str
    item: str  # the item's JSON


@dataclass(frozen=True)
class View:
    """A group as one read of the file saw it."""

    label: str
    size: int
    state: State
    count: int
    opened: float
    lease_until: float
    results: str | None
    error: str | None

    @property
    def full(self) -> bool:
        return self.count >= self.size


@dataclass(frozen=True)
class Bounds:
    timeout_s: float
    max_open: int
    keep_s: float


class GroupStore:
    def __init__(self, path: Path, bounds: Bounds) -> None:
        self.path = path
        self.bounds = bounds
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # its -wal and -shm take its mode
            os.close(fd)
            self._db = sqlite3.connect(path, isolation_level=None)
            self._db.execute("PRAGMA busy_timeout = 10000")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
        except (sqlite3.Error, OSError) as err:
            raise ServiceUnavailable(f"held groups {path}: {err}") from err
        self._write(lambda: [self._db.execute(s) for s in _SCHEMA])
        (self._version,), = self._rows("PRAGMA data_version")

    def close(self) -> None:
        self._db.close()

    def _write(self, work: Callable[[], T]) -> T:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                done = work()
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return done
        except sqlite3.Error as err:
            raise ServiceUnavailable(f"held groups {self.path}: {err}") from err

    def _rows(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        return self._db.execute(sql, params).fetchall()

    def _tick(self, group: str) -> None:
        (seq,), = self._rows("UPDATE held_clock SET n = n + 1 WHERE one = 1 RETURNING n")
        self._db.execute("UPDATE held_groups SET seq = ? WHERE grp = ?", (seq, group))

    def join(self, group: str, label: str, size: int, members: list[Member],
             now: float) -> dict[str, str]:
        """Add `members` to `group` (opening it); the members refused, with why. Raises
        `TooManyGroups` where a new group would pass GRM_GROUP_MAX_OPEN."""
        return self._write(lambda: self._join(group, label, size, members, now))

    def _join(self, group: str, label: str, size: int, members: list[Member],
              now: float) -> dict[str, str]:
        row = self._rows("SELECT size, state FROM held_groups WHERE grp = ?", (group,))
        if not row:
            self._open(group, label, size, now)
        elif row[0][0] != size:
            said = (f"group {label!r} has {row[0][0]} items (as its first item said); this item "
                    f"says group_size={size}: send one size for every item of a group")
            return {m.id: said for m in members}
        # A finished group takes no member: its retries read its outcome.
        finished = bool(row) and row[0][1] not in (State.OPEN, State.CLAIMED)
        known = dict(self._rows("SELECT id, digest FROM held_members WHERE grp = ?", (group,)))
        refused = {}
        for m in members:
            why = _refusal(m, known, label, size)
            if why:
                refused[m.id] = why
            elif m.id not in known and not finished:
                self._db.execute("INSERT INTO held_members VALUES (?, ?, ?, ?, ?)",
                                 (group, m.id, m.digest, m.item, now))
                known[m.id] = m.digest
        self._tick(group)
        return refused

    def _open(self, group: str, label: str, size: int, now: float) -> None:
        b = self.bounds
        where = {"now": now, "timeout": b.timeout_s}
        (live, oldest), = self._rows(f"SELECT count(*), min(opened) FROM held_groups "
                                     f"WHERE {_LIVE}", where)
        if live >= b.max_open:
            wait = max(1.0, (oldest or now) + b.timeout_s - now)
            raise TooManyGroups(
                f"{live} groups are open, the limit (GRM_GROUP_MAX_OPEN={b.max_open}): group "
                f"{label!r} is refused; retry after its oldest group completes or times out",
                retry_after=wait)
        self._db.execute("INSERT INTO held_groups (grp, label, size, opened, state, seq) "
                         "VALUES (?, ?, ?, ?, 'open', 0)", (group, label, size, now))

    def look(self, group: str) -> View | None:
        rows = self._rows(f"SELECT label, size, state, {_COUNT}, opened, lease_until, results, "
                          "error FROM held_groups WHERE grp = ?", (group,))
        if not rows:
            return None
        label, size, state, count, opened, lease, results, error = rows[0]
        return View(label, size, State(state), count, opened, lease, results, error)

    def claim(self, group: str, me: str, now: float, until: float) -> list[str] | None:
        """The group's items, where this call took the claim on a full group (none held it,
        or its holder's lease ran out); None where another holds it or it is not full."""

        def take() -> list[str] | None:
            cur = self._db.execute(
                f"UPDATE held_groups SET state = 'claimed', claimer = ?, lease_until = ? "
                f"WHERE grp = ? AND {_COUNT} >= size AND (state = 'open' OR "
                f"(state = 'claimed' AND lease_until <= ?))", (me, until, group, now))
            if cur.rowcount != 1:
                return None
            self._tick(group)
            return [item for (item,) in self._rows(
                "SELECT item FROM held_members WHERE grp = ? ORDER BY id", (group,))]

        return self._write(take)

    def renew(self, group: str, me: str, until: float) -> bool:
        return self._write(lambda: self._db.execute(
            "UPDATE held_groups SET lease_until = ? WHERE grp = ? AND state = 'claimed' AND "
            "claimer = ?", (until, group, me)).rowcount == 1)

    def release(self, group: str, me: str) -> None:
        """Give the claim back at once (the judging was cancelled): the next waiter takes it."""

        def give() -> None:
            if self._db.execute("UPDATE held_groups SET state = 'open', claimer = NULL, "
                                "lease_until = 0 WHERE grp = ? AND state = 'claimed' AND "
                                "claimer = ?", (group, me)).rowcount:
                self._tick(group)

        self._write(give)

    def finish(self, group: str, me: str, results: str, now: float) -> bool:
        """The results, where this claimer still holds the claim. The items' JSON goes (the
        digests stay, to tell a retry from a conflict)."""

        def done() -> bool:
            if self._db.execute(
                    "UPDATE held_groups SET state = 'done', results = ?, finished = ? WHERE "
                    "grp = ? AND state = 'claimed' AND claimer = ?",
                    (results, now, group, me)).rowcount != 1:
                return False
            self._db.execute("UPDATE held_members SET item = '' WHERE grp = ?", (group,))
            self._tick(group)
            return True

        return self._write(done)

    def fail(self, group: str, me: str, error: str, now: float) -> bool:
        """The claimer's judging raised: every member gets `error` (where this claimer still
        holds the claim)."""
        return self._write(lambda: self._end_locked(
            group, error, now, "state = 'claimed' AND claimer = ?", (me,)))

    def expire(self, group: str, now: float) -> None:
        """A group not full within GRM_GROUP_TIMEOUT_S of its opening fails, saying so."""

        def end() -> None:
            view = self.look(group)
            timeout = self.bounds.timeout_s
            if view is None or view.state != State.OPEN or view.full or \
                    view.opened + timeout > now:
                return
            error = (f"group {view.label!r} timed out: {view.count} of its {view.size} items "
                     f"came within {timeout:g} s (GRM_GROUP_TIMEOUT_S); send every item of a "
                     "group with the same group_id and group_size, or raise the timeout")
            self._end_locked(group, error, now, "state = 'open'", ())

        self._write(end)

    def _end_locked(self, group: str, error: str, now: float, when: str,
                    params: tuple[Any, ...]) -> bool:
        if not self._db.execute(f"UPDATE held_groups SET state = 'failed', error = ?, "
                                f"finished = ? WHERE grp = ? AND {when}",
                                (error, now, group, *params)).rowcount:
            return False
        self._db.execute("UPDATE held_members SET item = '' WHERE grp = ?", (group,))
        self._tick(group)
        return True

    def clock(self) -> int:
        """The change count now: the groups written after it are `changed` since it."""
        (n,), = self._rows("SELECT n FROM held_clock")
        return int(n)

    def changed(self, since: int) -> tuple[int, list[str]]:
        """The groups written since change count `since`, and the count now; nothing to read
        where no other connection committed since the last call (`data_version`)."""
        (version,), = self._rows("PRAGMA data_version")
        if version == self._version:
            return since, []
        self._version = version
        rows = self._rows("SELECT grp, seq FROM held_groups WHERE seq > ?", (since,))
        return max([since, *(seq for _, seq in rows)]), [grp for grp, _ in rows]

    def prune(self, now: float) -> int:
        """Forget the groups nobody will ask about again; how many."""
        b = self.bounds
        where = {"now": now, "timeout": b.timeout_s, "keep": b.keep_s}

        def drop() -> int:
            self._db.execute(f"DELETE FROM held_members WHERE grp IN "
                             f"(SELECT grp FROM held_groups WHERE {_STALE})", where)
            return int(self._db.execute(f"DELETE FROM held_groups WHERE {_STALE}",
                                        where).rowcount)

        return self._write(drop)

    def open_groups(self, now: float) -> int:
        (live,), = self._rows(f"SELECT count(*) FROM held_groups WHERE {_LIVE}",
                              {"now": now, "timeout": self.bounds.timeout_s})
        return int(live)


def _refusal(m: Member, known: dict[str, str], label: str, size: int) -> str | None:
    """Why `m` cannot join: its id came before with other content, or the group is full
    without it. A member sent again as it was is a retry: it joins again."""
    if m.id in known:
        if known[m.id] == m.digest:
            return None
        return (f"item {m.id!r} of group {label!r} came before with other content: an item id "
                "names one item of its group; give this one another id")
    if len(known) >= size:
        return (f"group {label!r} already has its {size} items and item {m.id!r} is not one of "
                "them: each item of a group needs its own id, and group_size counts them all")
    return None
