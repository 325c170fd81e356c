"""The store suite: run on a real SQLite file and on a real PostgreSQL server alike."""

from __future__ import annotations

import json
import time

from grm_service.ledger.batches import MAX_BATCH_RECORDS, unpack
from grm_service.ledger.location import open_store
from grm_service.ledger.query import all_records
from grm_service.ledger.records import Origin, Record
from grm_service.ledger.store import COLUMNS, Selection, Store, lookup_digest, row_values


def record(n: int, *, run: str | None = "r1", step: int | None = 0, key: str = "key-a",
           fp: str = "grm-1", cache: str = "", at: float | None = None,
           body: bytes | None = b"{}", path: str = "/v1/chat/completions") -> Record:
    payload = json.dumps({"choices": [{"index": 0, "message": {"content": f"answer {n}"}}],
                          "n": n}).encode()
    fields = {"fingerprint_id": fp, "request_digest": f"req{n}", "response_digest": f"resp{n}",
              "replica": "r0", **({"cache": cache} if cache else {})}
    return Record(time.time() if at is None else at, Origin("/v1/score", key, run, step), path,
                  fp, f"req{n}", f"resp{n}", body, payload, fields, cache)


def stored_values(store: Store) -> list[list[object]]:
    """Every record's values as the batches hold them, in id order."""
    batches = store.query("SELECT ends, data FROM ledger_batches ORDER BY id")
    return [values for ends, data in batches for values in unpack(bytes(data), bytes(ends))]


def stored(store: Store, column: str, values: list[object]) -> object:
    return values[COLUMNS.index(column)]


def test_a_record_comes_back_byte_for_byte(store: Store) -> None:
    body = b'{"messages":[{"content":"\xc3\xa9","role":"user"}],"seed":7}' + bytes(range(3))
    written = record(1, body=body)
    store.write([written])
    [back] = store.records(Selection())
    assert back.body == body and back.payload == written.payload
    assert back.fields == written.fields and back.origin == written.origin
    assert back.id is not None and store.record(back.id) == back
    assert store.records(Selection())[0].at == written.at


def _fingerprint(n: int, cache: str = "") -> dict[str, object]:
    """Fields in `Fingerprint`'s order, as the gateway builds them."""
    return {"fingerprint_id": "grm-1", "identity": "verified", "seed": 7, "model_hash": "m" * 64,
            "env_digest": "e" * 32, "engine": "vllm", "engine_version": "0.25.0",
            "device": "cpu", "tensor_parallel_size": 1, "replica": "r0", "serialized": False,
            "request_digest": f"req{n}", "response_digest": f"resp{n}",
            **({"cache": cache} if cache else {})}


def test_the_fingerprint_is_stored_once_and_reads_back_in_its_order(store: Store) -> None:
    """Its digests are columns, not repeated in the `fields` text; read back, the fields are
    the same and in the same order (a served copy renders them in it)."""
    computed, served = record(1), record(2, cache="hit")
    computed.fields, served.fields = _fingerprint(1), _fingerprint(2, "hit")
    store.write([computed, served])
    texts = [json.loads(stored(store, "fields", values)) for values in stored_values(store)]
    assert all(not {"fingerprint_id", "request_digest", "response_digest"} & set(t)
               for t in texts)
    back = store.records(Selection())
    assert [list(r.fields.items()) for r in back] == [list(computed.fields.items()),
                                                      list(served.fields.items())]


def test_a_record_whose_text_holds_the_whole_fingerprint_reads_back_the_same(store: Store) -> None:
    """Records written before the digests left the text."""
    written = record(1)
    written.fields = _fingerprint(1)
    values = list(row_values(written))
    values[COLUMNS.index("fields")] = json.dumps(written.fields)
    store.write_rows([tuple(values)])
    [back] = store.records(Selection())
    assert list(back.fields.items()) == list(written.fields.items())


def test_nothing_follows_the_last_possible_id(store: Store) -> None:
    store.write([record(1)])
    assert store.records(Selection(), after=2**63 - 1) == []
    assert len(store.records(Selection(), after=2**63 - 2)) == 0


def test_digests_only_records_keep_no_body(store: Store) -> None:
    store.write([record(1, body=None)])
    assert store.records(Selection())[0].body is None


def test_lookup_matches_identity_request_and_path_and_skips_served_copies(store: Store) -> None:
    store.write([record(1, fp="grm-old"), record(1, cache="hit"), record(2)])
    assert store.lookup("grm-1", "req1", "/v1/chat/completions") is None  # only a hit, or old
    store.write([record(1)])
    found = store.lookup("grm-1", "req1", "/v1/chat/completions")
    assert found is not None and found.cache == "" and found.fingerprint_id == "grm-1"
    assert store.lookup("grm-1", "req1", "/classify") is None
    assert store.lookup("grm-2", "req1", "/v1/chat/completions") is None


def test_a_key_sees_only_its_own_records(store: Store) -> None:
    store.write([record(1, key="key-a"), record(2, key="key-b"), record(3, key="key-b")])
    assert [r.request_digest for r in store.records(Selection(key_id="key-b"))] == ["req2",
                                                                                   "req3"]
    first = store.records(Selection(key_id="key-a"))[0]
    assert first.id is not None
    assert store.record(first.id, "key-b") is None and store.record(first.id, "key-a") == first
    assert [r["requests"] for r in store.runs("key-b")] == [2]


def test_runs_steps_and_step_ranges(store: Store) -> None:
    store.write([record(i, run="a", step=i // 2) for i in range(10)]
                + [record(20, run=None, step=None), record(21, run="b", step=3, cache="hit")])
    runs = {r["run"]: r for r in store.runs()}
    assert set(runs) == {"a", "", "b"}
    assert (runs["a"]["requests"], runs["a"]["first_step"], runs["a"]["last_step"]) == (10, 0, 4)
    assert runs["b"]["cached"] == 1 and runs["a"]["cached"] == 0
    assert [(s["step"], s["requests"]) for s in store.steps("a")] == [(i, 2) for i in range(5)]
    chosen = store.records(Selection(run="a", first_step=1, last_step=2))
    assert [r.request_digest for r in chosen] == ["req2", "req3", "req4", "req5"]
    assert [r.request_digest for r in store.records(Selection(run=""))] == ["req20"]


def test_pages_go_through_every_record_in_order(store: Store) -> None:
    store.write([record(i) for i in range(1203)])
    seen = [r.request_digest for r in all_records(store, Selection())]
    assert seen == [f"req{i}" for i in range(1203)]


def test_prune_drops_old_records_first_by_age_then_by_size(store: Store) -> None:
    """A batch (one write: a flush) goes whole."""
    now = time.time()
    for i in range(5):
        store.write([record(i, at=now - 1000 + i), record(100 + i, at=now - 1000 + i)])
    assert store.prune(1 << 40, 997.5, now) == 6  # ages 1000, 999 and 998
    assert [r.request_digest for r in store.records(Selection())] == ["req3", "req103", "req4",
                                                                      "req104"]
    store.write([record(7, at=now - 2000), record(8, at=now)])
    assert store.prune(1 << 40, 997.5, now) == 0, "a batch stays while its newest is young"
    big = b"x" * 200_000
    for i in range(20):
        store.write([record(10 + i, body=big)])
    store.prune(2_000_000, 1e9, now)
    left = store.records(Selection())
    assert store.used_bytes() <= 2_000_000
    assert 0 < len(left) < 26 and left[-1].request_digest == "req29"  # the newest stay
    assert all(r.id is not None and store.record(r.id) == r for r in left)


def test_a_pruned_record_is_neither_read_nor_looked_up(store: Store) -> None:
    now = time.time()
    store.write([record(1, at=now - 100)])
    store.write([record(2, at=now)])
    [old, _] = store.records(Selection())
    assert old.id is not None and store.lookup("grm-1", "req1", "/v1/chat/completions") == old
    assert store.prune(1 << 40, 50, now) == 1
    assert store.record(old.id) is None
    assert store.lookup("grm-1", "req1", "/v1/chat/completions") is None
    assert [r["requests"] for r in store.runs()] == [1]


def test_a_flush_larger_than_a_batch_is_split_and_reads_back_whole(store: Store) -> None:
    """More records than one batch holds: several batches, one transaction, ids in order."""
    store.write([record(i, step=i % 3) for i in range(MAX_BATCH_RECORDS + 10)])
    assert len(store.query("SELECT id FROM ledger_batches")) == 2
    back = list(all_records(store, Selection()))
    assert [r.request_digest for r in back] == [f"req{i}" for i in range(MAX_BATCH_RECORDS + 10)]
    assert [r.id for r in back] == list(range(1, MAX_BATCH_RECORDS + 11))
    assert [s["requests"] for s in store.steps("r1")] == [1369, 1369, 1368]
    last = store.lookup("grm-1", f"req{MAX_BATCH_RECORDS + 9}", "/v1/chat/completions")
    assert last is not None and last.id == MAX_BATCH_RECORDS + 10


def test_the_request_behind_a_reward_is_found_by_its_digest(store: Store) -> None:
    store.write([record(i) for i in range(30)])
    store.write([record(i) for i in range(5)])  # repeats, in a second batch
    found = store.records(Selection(request_digest="req3"))
    assert [(r.request_digest, r.id) for r in found] == [("req3", 4), ("req3", 34)]
    assert store.records(Selection(request_digest="req")) == []  # a part of one is no digest
    assert store.records(Selection(request_digest="req3", key_id="key-b")) == []


def test_two_stores_on_one_location_see_each_others_writes(location: str) -> None:
    """`serve --workers N`: every worker writes to the same ledger."""
    a, b = open_store(location), open_store(location)
    try:
        a.write([record(1)])
        b.write([record(2)])
        assert [r.request_digest for r in a.records(Selection())] == ["req1", "req2"]
    finally:
        a.close()
        b.close()


def test_only_records_the_cache_may_answer_are_looked_up(store: Store) -> None:
    """Chat's records (its cache off by default) stay out of the lookup index, but not out of
    the ledger."""
    unindexed = record(1)
    unindexed.indexed = False
    store.write([unindexed, record(2)])
    assert store.lookup("grm-1", "req1", "/v1/chat/completions") is None
    assert store.lookup("grm-1", "req2", "/v1/chat/completions") is not None
    back = {r.request_digest: r.indexed for r in store.records(Selection())}
    assert back == {"req1": False, "req2": True}


def test_a_scoped_lookup_finds_its_keys_records_only(store: Store) -> None:
    """The cache per key (`lookup_digest`'s scope). A record of a ledger written before scopes
    (unscoped) is found where the cache is shared and missed, never another key's, per key."""
    chat = "/v1/chat/completions"
    store.write_rows([row_values(record(1, key="key-a"), "key-a")])
    store.write([record(2, key="key-a")])  # as written before scopes
    assert store.lookup("grm-1", "req1", chat, "key-a") is not None
    assert store.lookup("grm-1", "req1", chat, "key-b") is None
    assert store.lookup("grm-1", "req1", chat) is None
    assert store.lookup("grm-1", "req2", chat) is not None
    assert store.lookup("grm-1", "req2", chat, "key-a") is None
    assert store.lookup("grm-1", "req2", chat, "key-b") is None
    # Scopes that share the 64-bit integer are told apart by the record's key id.
    store.query("UPDATE ledger_lookup SET key = ? WHERE key = ?",
                [lookup_digest("grm-1", "req1", chat, "key-b"),
                 lookup_digest("grm-1", "req1", chat, "key-a")])
    assert store.lookup("grm-1", "req1", chat, "key-b") is None
