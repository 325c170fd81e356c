"""The ledger through the gateway's own routes, in process, a STUB replica behind (the gateway
is what is under test): tags, keys, the cache on /v1/score, the read-back API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grm_service.commands.diffing import load_results
from grm_service.config import Settings
from grm_service.gateway.request.context import ForwardContext
from grm_service.ledger.location import open_store
from grm_service.ledger.store import Selection
from tests.support.gateway import client, received, serving
from tests.support.procs import Proc, start_stub

KA, KB = "secret-ka", "secret-kb"
SCORERS = ["length=tests.support.scoring:length_score"]
MSGS = [{"role": "user", "content": "hello"}]
ITEMS = [{"id": "a", "completion": "x", "reference": "y"},
         {"id": "b", "completion": "z", "reference": "y"}]


def settings(stub: Proc, tmp_path: Path, **over: Any) -> Settings:
    """No live audit unless a test asks: its re-run of a sampled hit (1 % by default, drawn at
    random) would reach the STUB beside the requests a test counts there."""
    over.setdefault("audit_fraction", 0.0)
    return Settings(replica_urls=[stub.url], served_model_name="rm", work_dir=tmp_path,
                    scorers=SCORERS, **over)


async def flushed(gw: ForwardContext) -> None:
    assert gw.ledger is not None
    await gw.ledger.writer.flush()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def test_tags_are_kept_and_a_key_sees_only_its_own(stub: Proc, tmp_path: Path) -> None:
    async with serving(settings(stub, tmp_path, api_keys=[KA, KB])) as (hot, gw), \
            client(hot) as api:
        tags = {"x-grm-run": "grpo-7", "x-grm-step": "12"}
        r = await api.post("/v1/chat/completions", json={"messages": MSGS},
                           headers={**bearer(KA), **tags})
        assert r.status_code == 200, r.text
        await api.post("/v1/chat/completions", json={"messages": MSGS}, headers=bearer(KB))
        await flushed(gw)
        mine = (await api.get("/v1/ledger/runs", headers=bearer(KA))).json()["runs"]
        assert [(x["run"], x["requests"], x["first_step"]) for x in mine] == [("grpo-7", 1, 12)]
        [row] = (await api.get("/v1/ledger/records", params={"run": "grpo-7"},
                               headers=bearer(KA))).json()["records"]
        assert row["request_digest"] == r.headers["x-grm-request-digest"]
        shown = (await api.get(f"/v1/ledger/records/{row['id']}", headers=bearer(KA))).json()
        assert shown["request"]["messages"] == MSGS and shown["request"]["seed"] == 42
        assert shown["fingerprint"] == r.json()["grm_fingerprint"]
        other = await api.get(f"/v1/ledger/records/{row['id']}", headers=bearer(KB))
        assert other.status_code == 404
        theirs = (await api.get("/v1/ledger/runs", headers=bearer(KB))).json()["runs"]
        assert [(x["run"], x["requests"]) for x in theirs] == [("", 1)]
        assert (await api.get("/v1/ledger/runs")).status_code == 401
        assert "secret-k" not in (tmp_path / "ledger.sqlite").read_bytes().decode(errors="replace")


async def test_a_bad_step_tag_is_a_400_naming_it(stub: Proc, tmp_path: Path) -> None:
    async with serving(settings(stub, tmp_path)) as (hot, _), client(hot) as api:
        chat = await api.post("/v1/chat/completions", json={"messages": MSGS},
                              headers={"x-grm-step": "twelve"})
        score = await api.post("/v1/score", json={"scorer": "length", "items": ITEMS},
                               headers={"x-grm-step": "-1"})
        bad_steps = await api.get("/v1/ledger/records", params={"steps": "9:3"})
        huge_step = await api.get("/v1/ledger/records", params={"steps": str(2**64)})
        huge_after = await api.get("/v1/ledger/records", params={"after": str(2**64)})
        huge_id = await api.get(f"/v1/ledger/records/{2**70}")
    for r in (chat, score):
        assert r.status_code == 400 and "x-grm-step" in r.json()["error"]["message"], r.text
    assert bad_steps.status_code == 400 and "before the first" in bad_steps.text
    # Past what a 64-bit column holds: a 4xx, not the driver's overflow as a 500.
    assert huge_step.status_code == 400 and "between 0 and" in huge_step.text
    assert huge_after.status_code == huge_id.status_code == 422


async def test_integers_outside_ascii_digits_are_4xx_on_every_ledger_input(
    stub: Proc, tmp_path: Path
) -> None:
    """'²' is a digit to `str.isdigit` and not to `int`: the step tag was a 500."""
    texts = ["²", "٣", "-1", " 1", "1e3", "1_000", "+1"]
    async with serving(settings(stub, tmp_path)) as (hot, _), client(hot) as api, \
            client(hot.app) as routes:
        tagged = [await door.post(path, json=body, headers={"x-grm-step": b"\xb2"})
                  for door in (api, routes) for path, body in (
                      ("/v1/chat/completions", {"messages": MSGS}),
                      ("/v1/score", {"scorer": "length", "items": ITEMS}))]
        queried = [await api.get("/v1/ledger/records", params={name: text})
                   for text in texts for name in ("steps", "after", "limit")]
        ids = [await api.get(f"/v1/ledger/records/{text}") for text in texts]
        assert (await api.get("/v1/ledger/records", params={"after": "0", "limit": "5"})
                ).status_code == 200
    for r in tagged:
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "bad_tag" and "ASCII digits" in r.text
    for r in (*queried, *ids):
        assert r.status_code in (400, 422), r.text
        assert r.json()["error"]["type"] == "invalid_request_error"


async def test_a_repeated_score_batch_is_answered_from_the_ledger(stub: Proc,
                                                                  tmp_path: Path) -> None:
    # No audit: a sampled hit is re-run on an engine by design, which this counts as a miss.
    async with serving(settings(stub, tmp_path)) as (hot, _), \
            client(hot) as api:
        body = {"scorer": "length", "items": ITEMS}
        await received(stub.url)
        first = (await api.post("/v1/score", json=body)).json()
        assert len(await received(stub.url)) == 2
        again = (await api.post("/v1/score", json=body)).json()
        assert await received(stub.url) == []  # no engine reached
        chat = await api.post("/v1/chat/completions", json={"messages": MSGS})
        chat_again = await api.post("/v1/chat/completions", json={"messages": MSGS})
        assert len(await received(stub.url)) == 2  # chat: computed each time
        metrics = (await api.get("/metrics")).text
    for one, two in zip(first["results"], again["results"], strict=True):
        assert two["fingerprint"] == {**one["fingerprint"], "cache": "hit"}
        assert (two["score"], two["response"]) == (one["score"], one["response"])
        assert "cache" not in one["fingerprint"]
    assert "x-grm-cache" not in chat_again.headers and chat.status_code == 200
    assert 'grm_ledger_cache_total{outcome="hit"} 2.0' in metrics
    assert 'grm_ledger_cache_total{outcome="miss"} 2.0' in metrics


async def test_only_what_the_cache_may_answer_is_in_its_lookup_index(stub: Proc,
                                                                     tmp_path: Path) -> None:
    """Through the request path: computed score items are indexed (the cache looks them up,
    after a restart too), their hits and chat's answers are not (chat's cache is off)."""
    body = {"scorer": "length", "items": ITEMS}
    async with serving(settings(stub, tmp_path)) as (hot, gw), client(hot) as api:
        for _ in range(2):
            await api.post("/v1/score", json=body)
        await api.post("/v1/chat/completions", json={"messages": MSGS})
        await flushed(gw)
    store = open_store(str(tmp_path / "ledger.sqlite"))
    try:
        kept = [(r.origin.route, r.cache, r.indexed) for r in store.records(Selection())]
    finally:
        store.close()
    assert kept == [("/v1/score", "", True)] * 2 + [("/v1/score", "hit", False)] * 2 + [
        ("/v1/chat/completions", "", False)]
    async with serving(settings(stub, tmp_path)) as (hot, _), client(hot) as api:
        await received(stub.url)
        again = (await api.post("/v1/score", json=body)).json()
        assert await received(stub.url) == []  # the new process found them in the store
    assert all(r["fingerprint"]["cache"] == "hit" for r in again["results"])


async def test_a_key_is_never_answered_from_another_keys_record(stub: Proc,
                                                                tmp_path: Path) -> None:
    """A hit tells its asker that someone sent that exact request: per key by default, shared
    across keys only where GRM_LEDGER_CACHE_SHARED says so."""
    body = {"scorer": "length", "items": ITEMS}
    caches = []
    for shared in (False, True):
        where = tmp_path / str(shared)
        where.mkdir()
        over = {"api_keys": [KA, KB], "ledger_cache_shared": shared}
        async with serving(settings(stub, where, **over)) as (hot, _), client(hot) as api:
            await received(stub.url)
            for key in (KA, KB, KB):
                r = await api.post("/v1/score", json=body, headers=bearer(key))
                caches.append([item["fingerprint"].get("cache") for item in r.json()["results"]])
            computed = len(await received(stub.url))
        caches.append([computed])
    assert caches == [[None, None], [None, None], ["hit", "hit"], [4],  # per key
                      [None, None], ["hit", "hit"], ["hit", "hit"], [2]]  # shared


async def test_chat_cache_on_serves_the_recorded_bytes(stub: Proc, tmp_path: Path) -> None:
    async with serving(settings(stub, tmp_path, ledger_cache_chat=True)) as (hot, _), \
            client(hot) as api:
        first = await api.post("/v1/chat/completions", json={"messages": MSGS, "seed": 5})
        again = await api.post("/v1/chat/completions", json={"messages": MSGS, "seed": 5})
        other_seed = await api.post("/v1/chat/completions", json={"messages": MSGS, "seed": 6})
    assert again.headers["x-grm-cache"] == "hit" and "x-grm-cache" not in other_seed.headers
    a, b = first.json(), again.json()
    assert b.pop("grm_fingerprint") == {**a.pop("grm_fingerprint"), "cache": "hit"}
    assert b == a  # the engine's answer as recorded, its id and time included
    # A recorded answer names the same backend, which another seed does not change.
    assert b["system_fingerprint"] == other_seed.json()["system_fingerprint"]
    assert b["system_fingerprint"].startswith("grm-unverified-sys-")
    assert "unknown" not in b["system_fingerprint"]


async def test_export_is_what_diff_reads(stub: Proc, tmp_path: Path) -> None:
    async with serving(settings(stub, tmp_path)) as (hot, gw), client(hot) as api:
        for step in range(3):
            await api.post("/v1/score", json={"scorer": "length", "items": ITEMS},
                           headers={"x-grm-run": "r", "x-grm-step": str(step)})
        await flushed(gw)
        export = await api.get("/v1/ledger/export", params={"run": "r", "steps": "1:2"})
    out = tmp_path / "run.jsonl"
    out.write_bytes(export.content)
    rows = load_results(out)
    assert len(rows) == 4 and all(r["step"] in (1, 2) for r in rows.values())
    assert len({json.dumps(r["response"]) for r in rows.values()}) == 2


async def test_with_the_ledger_off_answers_go_on_and_its_api_says_so(stub: Proc,
                                                                      tmp_path: Path) -> None:
    async with serving(settings(stub, tmp_path, ledger=False)) as (hot, _), client(hot) as api:
        r = await api.post("/v1/chat/completions", json={"messages": MSGS})
        runs = await api.get("/v1/ledger/runs")
    assert r.status_code == 200 and runs.status_code == 404 and "GRM_LEDGER" in runs.text
    assert not (tmp_path / "ledger.sqlite").exists()




async def test_the_live_audit_recomputes_a_sample_of_hits(stub: Proc, tmp_path: Path) -> None:
    other = start_stub(tmp_path, "--record", "64")
    try:
        audited = Settings(replica_urls=[stub.url, other.url], served_model_name="rm",
                           work_dir=tmp_path, scorers=SCORERS, audit_fraction=1.0,
                           audit_max_per_s=1000)
        async with serving(audited) as (hot, gw), client(hot) as api:
            body = {"scorer": "length", "items": ITEMS}
            await api.post("/v1/score", json=body)  # computed: each item audited once
            assert gw.auditor is not None
            await wait_for(lambda: gw.auditor is not None and gw.auditor.audited == 2)
            again = (await api.post("/v1/score", json=body)).json()
            assert all(r["fingerprint"]["cache"] == "hit" for r in again["results"])
            await wait_for(lambda: gw.auditor is not None and gw.auditor.audited == 4)
            assert gw.auditor.matched == 4 and not gw.auditor.violations
    finally:
        other.stop()


async def wait_for(done: Callable[[], bool], timeout_s: float = 10) -> None:
    async with asyncio.timeout(timeout_s):
        while not done():
            await asyncio.sleep(0.01)
