"""The Ledger as the request path uses it: recorded, answered from the record, coalesced."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from grm_service.config import Settings
from grm_service.fingerprint import digest
from grm_service.gateway.request.answer import Forwarded
from grm_service.ledger.book import CHAT_ROUTE, SCORE_ROUTE, Ledger
from grm_service.ledger.location import open_store
from grm_service.ledger.records import Origin
from grm_service.ledger.store import Selection
from grm_service.metrics import Metrics

RAW = [b'{"messages":[],', b'"seed":1}']
SCORE = Origin(SCORE_ROUTE, "key-a", "run-1", 3)


def settings(tmp_path: Path, **over: Any) -> Settings:
    fields: dict[str, Any] = {"ledger_url": str(tmp_path / "l.sqlite"), "ledger_bodies": "all",
                              **over}
    return Settings(replica_urls=["http://127.0.0.1:9"], ledger_flush_interval_s=0.05, **fields)


class Engine:
    """Counts computations; `gate` holds them until set."""

    def __init__(self, fp: str = "grm-1") -> None:
        self.calls = 0
        self.fp = fp
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self) -> Forwarded:
        self.calls += 1
        await self.gate.wait()
        payload = {"id": f"call-{self.calls}", "choices": [{"message": {"content": "4"}}]}
        fields = {"fingerprint_id": self.fp, "request_digest": digest(b"".join(RAW)),
                  "response_digest": "d", "replica": "r0"}
        return Forwarded(payload, fields, SYSTEM)


SYSTEM = "grm-sys-0"  # the answers' system_fingerprint: what the ledger keeps is not about it


def served(payload: dict[str, Any], fields: dict[str, Any]) -> Forwarded:
    return Forwarded(payload, fields, SYSTEM)


async def ask(book: Ledger, origin: Origin, expected: str, compute: Any,
              path: str = "/v1/chat/completions", cacheable: bool = True) -> tuple[Forwarded, str]:
    """What `proxy.forward` does: `cacheable` False is a request pinned to a replica."""
    if not book.may_answer(origin, pinned=not cacheable):
        answer = await compute()
        book.record(path, RAW, origin, answer)
        return answer, ""
    return await answered(book, path, RAW, digest(b"".join(RAW)), origin, expected, compute)


async def answered(book: Ledger, path: str, raw: list[bytes], request_digest: str,
                   origin: Origin, expected: str, compute: Any) -> tuple[Forwarded, str]:
    """The sequence `proxy.forward` calls where the cache may answer: look up, else compute
    while identical requests wait; record either way."""
    lookup = book.lookup_of(path, request_digest, origin, expected)
    found = await book.look_up(lookup)
    if found is None:
        with book.lead(lookup) as lead:
            answer = await compute()
            lead.done(answer)
        how = ""
    else:
        answer, how = served(*found), found[1]["cache"]
    book.record(path, raw, origin, answer, how, book.scope(origin))
    return answer, how


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    book = Ledger(settings(tmp_path), Metrics())
    book.start()
    yield book
    await book.close()


async def test_every_answer_is_recorded_with_its_tags(ledger: Ledger, tmp_path: Path) -> None:
    engine = Engine()
    chat = Origin(CHAT_ROUTE, "key-b", None, None)
    answer, how = await ask(ledger, chat, "grm-1", engine)
    assert how == "" and engine.calls == 1
    await ledger.close()
    [row] = open_store(str(tmp_path / "l.sqlite")).records(Selection())
    assert row.body == b"".join(RAW) and json.loads(row.payload) == answer.payload
    assert row.origin == chat and row.fields == answer.fields and row.cache == ""


async def test_chat_repeats_are_computed_again_by_default(ledger: Ledger) -> None:
    engine = Engine()
    chat = Origin(CHAT_ROUTE)
    for _ in range(2):
        await ask(ledger, chat, "grm-1", engine)
    assert engine.calls == 2


async def test_a_score_repeat_is_the_recorded_answer_marked_a_hit(ledger: Ledger) -> None:
    engine = Engine()
    first, _ = await ask(ledger, SCORE, "grm-1", engine)
    again, how = await ask(ledger, SCORE, "grm-1", engine)
    assert engine.calls == 1 and how == "hit"
    assert again.payload == first.payload and again.fields == {**first.fields, "cache": "hit"}
    assert again.fingerprint.cache == "hit"


async def test_the_key_is_the_digest_the_request_path_gives(ledger: Ledger) -> None:
    # The request path hashes the canonical body once, for the key and the fingerprint: the
    # ledger keys by that digest, and does not hash the body again.
    engine = Engine()
    await ask(ledger, SCORE, "grm-1", engine)
    _, how = await answered(ledger, "/v1/chat/completions", [b"not hashed"],
                            digest(b"".join(RAW)), SCORE, "grm-1", engine)
    assert how == "hit" and engine.calls == 1


async def test_a_repeat_under_other_run_and_step_tags_is_a_hit(ledger: Ledger,
                                                                tmp_path: Path) -> None:
    # A trainer's repeated run (or a validation set asked at every step) sends the same bodies
    # under other tags: the tags go on the record, never into the key.
    engine = Engine()
    await ask(ledger, SCORE, "grm-1", engine)
    later = Origin(SCORE_ROUTE, "key-a", "run-2", 40)
    untagged = Origin(SCORE_ROUTE, "key-a")
    hows = [(await ask(ledger, origin, "grm-1", engine))[1] for origin in (later, untagged)]
    assert hows == ["hit", "hit"] and engine.calls == 1
    await ledger.close()
    rows = open_store(str(tmp_path / "l.sqlite")).records(Selection())
    assert [(r.origin.run, r.origin.step, r.cache) for r in rows] == [
        ("run-1", 3, ""), ("run-2", 40, "hit"), (None, None, "hit")]


async def test_a_hit_comes_from_the_store_after_a_restart(tmp_path: Path) -> None:
    engine = Engine()
    first = Ledger(settings(tmp_path), Metrics())
    first.start()
    computed, _ = await ask(first, SCORE, "grm-1", engine)
    await first.close()
    second = Ledger(settings(tmp_path), Metrics())
    second.start()
    again, how = await ask(second, SCORE, "grm-1", engine)
    await second.close()
    assert how == "hit" and engine.calls == 1 and again.payload == computed.payload


async def test_a_hit_is_found_while_another_process_holds_the_write_lock(tmp_path: Path) -> None:
    """A worker moving an earlier ledger into batches holds the file's write lock for seconds:
    the cache's reader opens without it (a WAL reader), where a writable open waited 10 s."""
    engine = Engine()
    first = Ledger(settings(tmp_path), Metrics())
    first.start()
    await ask(first, SCORE, "grm-1", engine)
    await first.close()
    other = sqlite3.connect(tmp_path / "l.sqlite", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    second = Ledger(settings(tmp_path), Metrics())
    second.start()
    try:
        _, how = await asyncio.wait_for(ask(second, SCORE, "grm-1", engine), 5)
    finally:
        other.execute("ROLLBACK")
        other.close()
    await second.close()
    assert how == "hit" and engine.calls == 1


async def test_a_ledger_of_the_earlier_layout_is_a_miss_until_moved(tmp_path: Path) -> None:
    """Another worker moves it (here: nobody, the writer never flushes in the test's time)."""
    with sqlite3.connect(tmp_path / "l.sqlite") as db:
        db.execute("CREATE TABLE ledger (id INTEGER PRIMARY KEY, at REAL)")
    book = Ledger(settings(tmp_path), Metrics())  # not started: its writer never opens it
    engine = Engine()
    _, how = await ask(book, SCORE, "grm-1", engine)
    look = sqlite3.connect(tmp_path / "l.sqlite")
    tables = look.execute("SELECT name FROM sqlite_master").fetchall()
    look.close()
    assert how == "" and engine.calls == 1 and tables == [("ledger",)]
    await book.close()  # its writer moves it now (no records) and writes this one
    assert len(open_store(str(tmp_path / "l.sqlite")).records(Selection())) == 1


async def test_another_identity_or_path_is_a_miss(ledger: Ledger) -> None:
    engine = Engine()
    await ask(ledger, SCORE, "grm-1", engine)
    _, how = await ask(ledger, SCORE, "grm-2", engine)
    _, how_path = await ask(ledger, SCORE, "grm-1", engine, path="/classify")
    _, pinned = await ask(ledger, SCORE, "grm-1", engine, cacheable=False)
    assert (how, how_path, pinned) == ("", "", "") and engine.calls == 4


async def test_identical_requests_in_flight_are_computed_once(ledger: Ledger) -> None:
    engine = Engine()
    engine.gate.clear()
    tasks = [asyncio.create_task(ask(ledger, SCORE, "grm-1", engine)) for _ in range(5)]
    await asyncio.sleep(0)  # each has asked the reader's thread for its record
    # The reader's one thread answers in order: once this returns, all five have their (empty)
    # lookups back and wait in flight (nothing else awaits between the lookup and the wait).
    await ledger.read(lambda _: None)
    await asyncio.sleep(0)
    engine.gate.set()
    answers = await asyncio.gather(*tasks)
    assert engine.calls == 1
    assert sorted(how for _, how in answers) == ["", "coalesced", "coalesced", "coalesced",
                                                 "coalesced"]
    assert len({json.dumps(a.payload) for a, _ in answers}) == 1


async def test_a_failed_computation_fails_its_waiters_and_is_not_kept(ledger: Ledger) -> None:
    calls = 0

    async def failing() -> Forwarded:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.02)
        raise RuntimeError("engine down")

    tasks = [asyncio.create_task(ask(ledger, SCORE, "grm-1", failing)) for _ in range(3)]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert calls == 1 and all(isinstance(r, RuntimeError) for r in results)
    _, how = await ask(ledger, SCORE, "grm-1", Engine())
    assert how == ""


async def test_digests_only_and_tagged_bodies(tmp_path: Path) -> None:
    for bodies, kept in (("none", [False, False]), ("tagged", [True, False])):
        path = tmp_path / f"{bodies}.sqlite"
        book = Ledger(settings(tmp_path, ledger_bodies=bodies, ledger_url=str(path)), Metrics())
        book.start()
        for origin in (Origin(CHAT_ROUTE, run="r"), Origin(CHAT_ROUTE)):
            await ask(book, origin, "grm-1", Engine())
        await book.close()
        rows = open_store(str(path)).records(Selection())
        assert [r.body is not None for r in rows] == kept, bodies


async def test_one_keys_repeat_is_never_answered_from_another_keys(ledger: Ledger) -> None:
    """A hit would tell key B that someone sent that exact request: the cache is per key."""
    engine = Engine()
    other = Origin(SCORE_ROUTE, "key-b", "run-1", 3)
    hows = [(await ask(ledger, origin, "grm-1", engine))[1] for origin in (SCORE, other, SCORE,
                                                                            other)]
    assert hows == ["", "", "hit", "hit"] and engine.calls == 2


async def test_one_keys_request_in_flight_is_not_another_keys_answer(ledger: Ledger) -> None:
    engine = Engine()
    engine.gate.clear()
    other = Origin(SCORE_ROUTE, "key-b")
    tasks = [asyncio.create_task(ask(ledger, origin, "grm-1", engine))
             for origin in (SCORE, other, SCORE)]
    await asyncio.sleep(0)
    await ledger.read(lambda _: None)  # every lookup back (see the test above)
    await asyncio.sleep(0)
    engine.gate.set()
    hows = [how for _, how in await asyncio.gather(*tasks)]
    assert engine.calls == 2 and hows == ["", "", "coalesced"]


async def test_a_shared_cache_answers_every_key_from_one_record(tmp_path: Path) -> None:
    engine = Engine()
    book = Ledger(settings(tmp_path, ledger_cache_shared=True), Metrics())
    book.start()
    _, first = await ask(book, SCORE, "grm-1", engine)
    _, other = await ask(book, Origin(SCORE_ROUTE, "key-b"), "grm-1", engine)
    await book.close()
    again = Ledger(settings(tmp_path, ledger_cache_shared=True), Metrics())  # from the store
    again.start()
    _, third = await ask(again, Origin(SCORE_ROUTE, "key-c"), "grm-1", engine)
    await again.close()
    assert (first, other, third) == ("", "hit", "hit") and engine.calls == 1


async def test_a_per_key_hit_after_a_restart_is_the_keys_own(tmp_path: Path) -> None:
    engine = Engine()
    first = Ledger(settings(tmp_path), Metrics())
    first.start()
    await ask(first, SCORE, "grm-1", engine)
    await first.close()
    second = Ledger(settings(tmp_path), Metrics())
    second.start()
    _, other = await ask(second, Origin(SCORE_ROUTE, "key-b"), "grm-1", engine)
    second.recent = type(second.recent)()  # from the store, not this process's memory
    _, own = await ask(second, SCORE, "grm-1", engine)
    await second.close()
    assert (other, own) == ("", "hit") and engine.calls == 2
