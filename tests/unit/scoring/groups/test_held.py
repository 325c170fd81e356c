"""Held groups (scoring/groups/held.py) on a real SQLite file: in this process, and across OS
processes that each bring some members of the same groups, as the workers of one service do."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from grm_service.errors import TooManyGroups
from grm_service.gateway.edge.replies import error_reply
from grm_service.scoring.groups.held import HeldGroups, HoldSettings
from grm_service.scoring.groups.store import Bounds, GroupStore, Member
from grm_service.scoring.models import ItemResult, ScoreItem
from tests.support.held_member import group_scores, judge_for

HOLD = {"timeout_s": 30.0, "max_open": 1000, "lease_s": 1.0, "poll_s": 0.02, "keep_s": 60.0}


def items(group: str, size: int, ids: list[int]) -> list[dict[str, Any]]:
    return [{"id": f"{group}-{i}", "completion": f"answer {i} of {group}", "group_id": group,
             "group_size": size} for i in ids]


def expected(group: str, size: int) -> dict[str, float]:
    return group_scores([ScoreItem.model_validate(i) for i in items(group, size, [*range(size)])])


def spec(tmp: Path, groups: dict[str, Any], **extra: Any) -> dict[str, Any]:
    hold = {**HOLD, **extra.pop("hold", {})}
    return {"file": str(tmp / "groups.sqlite"), "judged": str(tmp / "judged.log"),
            "hold": hold, "groups": groups, **extra}


def start(member_spec: dict[str, Any]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.Popen([sys.executable, "-m", "tests.support.held_member",
                             json.dumps(member_spec)], stdout=subprocess.PIPE, text=True,
                            env=env)


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    answer: dict[str, Any] = json.loads(out)
    return answer


def judged(tmp: Path) -> list[str]:
    path = tmp / "judged.log"
    return sorted(path.read_text().split()) if path.exists() else []


def scores(answer: dict[str, Any]) -> dict[str, float]:
    return {i: r["score"] for group in answer.values() for i, r in group.items()}


def test_members_from_four_processes_are_judged_once_per_group(tmp_path: Path) -> None:
    groups = ["g0", "g1", "g2"]
    procs = [start(spec(tmp_path, {g: {"size": 4, "items": items(g, 4, [p])} for g in groups}))
             for p in range(4)]

    answers = [finish(p) for p in procs]

    assert judged(tmp_path) == groups  # one judge call per group, whoever claimed it
    got = {i: s for a in answers for i, s in scores(a).items()}
    assert got == {i: s for g in groups for i, s in expected(g, 4).items()}
    assert all(r["status"] == "ok" for a in answers for g in a.values() for r in g.values())


def test_a_claimer_killed_mid_judge_is_taken_over_after_its_lease(tmp_path: Path) -> None:
    hang = tmp_path / "claimer.pid"
    first = start(spec(tmp_path, {"g": {"size": 2, "items": items("g", 2, [0])}},
                       hang=str(hang)))
    second = start(spec(tmp_path, {"g": {"size": 2, "items": items("g", 2, [1])}},
                        hang=str(hang)))
    deadline = time.monotonic() + 30
    while not (hang.exists() and hang.read_text()):
        assert time.monotonic() < deadline, "no claimer began judging"
        time.sleep(0.02)
    claimer = int(hang.read_text())
    os.kill(claimer, signal.SIGKILL)
    killed, survivor = (first, second) if claimer == first.pid else (second, first)
    killed.communicate(timeout=10)

    began = time.monotonic()
    answer = finish(survivor)
    # The survivor judged it once its lease ran out (1 s), not before.
    assert judged(tmp_path) == ["g"]
    assert scores(answer).items() <= expected("g", 2).items() and len(scores(answer)) == 1
    assert time.monotonic() - began < 10
    # The killed one's trainer retries its item: it gets the kept results, no new judging.
    lost = items("g", 2, [0 if killed is first else 1])
    retry = finish(start(spec(tmp_path, {"g": {"size": 2, "items": lost}})))
    assert scores(retry) == {lost[0]["id"]: expected("g", 2)[lost[0]["id"]]}
    assert judged(tmp_path) == ["g"]


def test_items_of_a_worker_killed_while_waiting_stay_in_the_file(tmp_path: Path) -> None:
    """A worker restarts: its waiting request is lost, its item is not. The group completes
    with the other worker's item, and the retried item gets the kept result."""
    first = start(spec(tmp_path, {"g": {"size": 2, "items": items("g", 2, [0])}}))
    deadline = time.monotonic() + 30
    while joined(tmp_path) < 1:
        assert time.monotonic() < deadline, "the first item never joined"
        time.sleep(0.02)
    first.kill()
    first.communicate(timeout=10)

    other = finish(start(spec(tmp_path, {"g": {"size": 2, "items": items("g", 2, [1])}})))
    retried = finish(start(spec(tmp_path, {"g": {"size": 2, "items": items("g", 2, [0])}})))

    assert {**scores(other), **scores(retried)} == expected("g", 2)
    assert judged(tmp_path) == ["g"]


def joined(tmp: Path) -> int:
    path = tmp / "groups.sqlite"
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(path, timeout=10)) as db:
        try:
            return int(db.execute("SELECT count(*) FROM held_members").fetchone()[0])
        except sqlite3.OperationalError:  # the tables are not made yet
            return 0


@pytest.fixture
async def held(tmp_path: Path) -> AsyncIterator[HeldGroups]:
    holder = HeldGroups(HoldSettings(path=tmp_path / "groups.sqlite", **{
        **HOLD, "timeout_s": 0.5, "max_open": 2}))
    await holder.start()
    yield holder
    await holder.close()


def members(group: str, size: int, ids: list[int]) -> list[ScoreItem]:
    return [ScoreItem.model_validate(i) for i in items(group, size, ids)]


async def test_a_group_not_complete_in_time_gives_each_waiter_an_error_naming_it(
        held: HeldGroups, tmp_path: Path) -> None:
    judge = judge_for({"judged": str(tmp_path / "judged.log")})
    answers = await asyncio.gather(held.score_held("d1", 3, members("late", 3, [0]), judge),
                                   held.score_held("d1", 3, members("late", 3, [1]), judge))

    results = [r for a in answers for r in a.values()]
    assert [r.status for r in results] == ["error", "error"]
    assert all(r.score is None for r in results)  # never a silent 0
    for r in results:
        assert r.error is not None
        assert "'late'" in r.error and "2 of its 3 items" in r.error
        assert "GRM_GROUP_TIMEOUT_S" in r.error
    assert judged(tmp_path) == []


async def test_a_new_group_past_the_cap_is_refused_with_429_and_retry_after(
        held: HeldGroups, tmp_path: Path) -> None:
    judge = judge_for({"judged": str(tmp_path / "judged.log")})
    waiting = [asyncio.create_task(held.score_held(f"d{g}", 2, members(f"g{g}", 2, [0]), judge))
               for g in range(2)]
    await asyncio.sleep(0.1)

    with pytest.raises(TooManyGroups) as refused:
        await held.score_held("d2", 2, members("g2", 2, [0]), judge)
    # A member of a group already open is no new group: it joins.
    joined = await held.score_held("d0", 2, members("g0", 2, [1]), judge)

    status, headers, body = error_reply(refused.value)
    assert status == 429 and "GRM_GROUP_MAX_OPEN=2" in refused.value.message
    assert json.loads(body)["error"]["code"] == "too_many_groups"
    assert int(dict(headers)[b"retry-after"]) >= 1
    assert joined["g0-1"].score == expected("g0", 2)["g0-1"]
    await asyncio.gather(*waiting)


async def test_a_retry_joins_again_and_a_changed_item_is_that_items_error(
        held: HeldGroups, tmp_path: Path) -> None:
    judge = judge_for({"judged": str(tmp_path / "judged.log")})
    changed = members("r", 3, [1])[0].model_copy(update={"completion": "something else"})
    first = asyncio.create_task(held.score_held("d", 3, members("r", 3, [0, 1]), judge))
    await asyncio.sleep(0.05)
    again = asyncio.create_task(held.score_held("d", 3, members("r", 3, [1]), judge))
    conflict = await held.score_held("d", 3, [changed], judge)
    last = await held.score_held("d", 3, members("r", 3, [2]), judge)

    want = expected("r", 3)
    assert conflict["r-1"].status == "error"
    assert "came before with other content" in (conflict["r-1"].error or "")
    assert {i: r.score for i, r in (await first).items()} == {"r-0": want["r-0"],
                                                               "r-1": want["r-1"]}
    assert (await again)["r-1"] == (await first)["r-1"]
    assert last["r-2"].score == want["r-2"]
    assert judged(tmp_path) == ["r"]
    # After the group is done: a retry gets the kept result; a fourth item is refused by name.
    late = await held.score_held("d", 3, members("r", 3, [0, 3]), judge)
    assert late["r-0"] == (await first)["r-0"]
    assert late["r-3"].status == "error" and "already has its 3 items" in (late["r-3"].error
                                                                            or "")
    assert judged(tmp_path) == ["r"]


async def test_an_item_with_another_group_size_is_refused(
        held: HeldGroups, tmp_path: Path) -> None:
    judge = judge_for({"judged": str(tmp_path / "judged.log")})
    first = asyncio.create_task(held.score_held("d", 2, members("s", 2, [0]), judge))
    await asyncio.sleep(0.05)
    other = await held.score_held("d", 3, members("s", 3, [1]), judge)
    assert "has 2 items" in (other["s-1"].error or "") and "group_size=3" in (
        other["s-1"].error or "")
    first.cancel()


async def test_a_judge_that_raises_fails_every_member_of_the_group(
        held: HeldGroups) -> None:
    async def broken(group: list[ScoreItem]) -> dict[str, ItemResult]:
        raise RuntimeError("the judge's engine went away")

    answers = await asyncio.gather(*(held.score_held("d", 2, members("b", 2, [i]), broken)
                                     for i in range(2)))
    errors = [r.error or "" for a in answers for r in a.values()]
    assert len(errors) == 2
    assert all("judging group 'b' failed" in e and "went away" in e for e in errors)


async def test_a_cancelled_claimer_gives_the_claim_back_at_once(tmp_path: Path) -> None:
    holder = HeldGroups(HoldSettings(path=tmp_path / "groups.sqlite", **{
        **HOLD, "lease_s": 60.0}))
    await holder.start()
    calls: list[int] = []
    judging = asyncio.Event()

    async def judge(group: list[ScoreItem]) -> dict[str, ItemResult]:
        calls.append(len(group))
        if len(calls) == 1:  # the first claimer's request goes away mid-judge
            judging.set()
            await asyncio.sleep(3600)
        return await judge_for({"judged": str(tmp_path / "judged.log")})(group)

    waiting = asyncio.create_task(holder.score_held("d", 2, members("c", 2, [0]), judge))
    await asyncio.sleep(0.05)
    claimer = asyncio.create_task(holder.score_held("d", 2, members("c", 2, [1]), judge))
    try:
        await judging.wait()
        claimer.cancel()
        # Well before the 60 s lease: the claim came back with the cancellation.
        answer = await asyncio.wait_for(waiting, 10)
        assert answer["c-0"].score == expected("c", 2)["c-0"] and calls == [2, 2]
        with pytest.raises(asyncio.CancelledError):
            await claimer
    finally:
        waiting.cancel()
        await holder.close()


async def test_a_claimer_judging_past_its_lease_keeps_the_claim(tmp_path: Path) -> None:
    """Two processes' holders on one file: the claimer renews its lease while it judges, so
    the other does not take the group over and judge it a second time."""
    hold = {**HOLD, "lease_s": 0.3}
    here, there = (HeldGroups(HoldSettings(path=tmp_path / "groups.sqlite", **hold))
                   for _ in range(2))
    await here.start()
    await there.start()
    calls: list[int] = []

    async def slow(group: list[ScoreItem]) -> dict[str, ItemResult]:
        calls.append(len(group))
        await asyncio.sleep(1.2)  # four leases
        return await judge_for({"judged": str(tmp_path / "judged.log")})(group)

    first = asyncio.create_task(there.score_held("d", 2, members("l", 2, [0]), slow))
    try:
        await asyncio.sleep(0.05)
        last = await asyncio.wait_for(here.score_held("d", 2, members("l", 2, [1]), slow), 20)
        assert {**{i: r.score for i, r in (await first).items()},
                **{i: r.score for i, r in last.items()}} == expected("l", 2)
        assert calls == [2]
    finally:
        first.cancel()
        await here.close()
        await there.close()


def test_groups_nobody_asks_about_are_dropped(tmp_path: Path) -> None:
    bounds = Bounds(timeout_s=10.0, max_open=10, keep_s=5.0)
    store = GroupStore(tmp_path / "groups.sqlite", bounds)
    one = [Member("a", "d", "{}")]
    store.join("open", "open", 2, one, now=100.0)
    store.join("done", "done", 1, one, now=100.0)
    assert store.claim("done", "me", 100.0, 130.0) == ["{}"]
    assert store.finish("done", "me", '{"a":{}}', now=101.0)
    assert store.open_groups(100.0) == 1

    assert store.prune(now=105.0) == 0  # kept their while
    assert store.prune(now=106.5) == 1  # the results, kept 5 s
    assert store.look("done") is None and store.look("open") is not None
    assert store.open_groups(110.5) == 0  # timed out: no longer counted against the cap
    assert store.prune(now=115.5) == 1  # opened 100, timed out at 110, kept 5 s more
    assert store.look("open") is None
    store.close()
