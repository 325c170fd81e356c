"""`POST /v1/score` and `POST /classify` of the FastAPI app in process, a STUB replica behind.

The custom scorers (tests/support/scoring.py) make the scores known: `rule` compares the
completion with the reference without asking the model, `length` asks the stub for a text.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from grm_service.config import Settings
from tests.support.gateway import client, received, serving
from tests.support.procs import Proc, start_stub

SCORERS = ["rule=tests.support.scoring:rule_score", "length=tests.support.scoring:length_score"]


def settings(stub: Proc, tmp_path: Path, **over: Any) -> Settings:
    return Settings(replica_urls=[stub.url], served_model_name="rm", work_dir=tmp_path,
                    scorers=SCORERS, **over)


async def test_a_batch_is_scored_in_input_order_and_counted(stub: Proc, tmp_path: Path) -> None:
    items = [{"id": "b", "completion": "4", "reference": "4"},
             {"id": "a", "completion": "5", "reference": "4"}]
    async with serving(settings(stub, tmp_path)) as (hot, gw), client(hot.app) as api:
        await received(stub.url)
        rule = await api.post("/v1/score", json={"scorer": "rule", "items": items})
        length = await api.post("/v1/score", json={"scorer": "length", "items": items[:1]})
        sent = await received(stub.url)
        count = gw.metrics.registry.get_sample_value
        counted = (count("grm_score_items_total", {"scorer": "rule", "status": "ok"}),
                   count("grm_score_items_total", {"scorer": "length", "status": "ok"}))
    assert rule.status_code == 200, rule.text
    assert [(r["id"], r["score"], r["status"]) for r in rule.json()["results"]] == [
        ("b", 1.0, "ok"), ("a", 0.0, "ok")]
    answer = length.json()["results"][0]
    assert answer["response"].startswith("stub-") and answer["fingerprint"]["replica"] == "r0"
    assert [s["path"] for s in sent] == ["/v1/chat/completions"], "rule asks no model"
    assert sent[0]["body"]["model"] == "rm" and sent[0]["body"]["max_tokens"] == 12
    assert counted == (2.0, 1.0)


async def test_batch_refusals_come_before_any_item_runs(stub: Proc, tmp_path: Path) -> None:
    item = {"id": "a", "completion": "x"}
    async with serving(settings(stub, tmp_path, max_score_items=2)) as (hot, _), \
            client(hot.app) as api:
        await received(stub.url)
        too_many = await api.post("/v1/score", json={"scorer": "length", "items": [item] * 3})
        unknown = await api.post("/v1/score", json={"scorer": "nope", "items": [item]})
        sampling = await api.post("/v1/score", json={"scorer": "length", "items": [item],
                                                     "sampling": {"max_tokens": 10**7}})
        missing = await api.post("/v1/score", json={"scorer": "length", "items": [{}]})
        assert await received(stub.url) == []
    assert too_many.status_code == 413 and "GRM_MAX_SCORE_ITEMS" in too_many.text
    assert unknown.status_code == 400 and "registered:" in unknown.json()["error"]["message"]
    assert sampling.status_code == 400 and "GRM_MAX_TOKENS_LIMIT" in sampling.text
    assert missing.status_code == 422 and missing.json()["error"]["param"] == "items.0.id"


async def test_classify_is_passed_through_with_a_fingerprint(stub: Proc, tmp_path: Path) -> None:
    body = {"input": "a good answer"}
    async with serving(settings(stub, tmp_path)) as (hot, _), client(hot.app) as api:
        await received(stub.url)
        r = await api.post("/classify", json=body)
        other = await api.post("/classify", json={**body, "model": "x"})
        (sent,) = await received(stub.url)
    assert r.status_code == 200, r.text
    assert r.json()["data"] == [{"index": 0, "probs": [0.25, 0.75]}]
    assert r.json()["grm_fingerprint"]["replica"] == r.headers["x-grm-replica"] == "r0"
    assert sent == {"path": "/classify", "body": {"input": "a good answer", "model": "rm"}}
    assert other.status_code == 404, other.text
    assert other.json()["error"]["type"] == "not_found_error"
    assert other.json()["error"]["code"] == "unknown_model"


async def test_a_batch_begun_before_the_drain_is_answered_whole(tmp_path: Path) -> None:
    """Two items at a time against a slow replica: most of the batch's engine requests start
    after the drain has begun, and none is refused; a batch that comes after it is (503), and
    the drain counts the begun batch in flight until it is answered."""
    slow = start_stub(tmp_path, "--delay", "0.2")
    items = [{"id": str(i), "completion": "x" * i} for i in range(6)]
    try:
        async with serving(settings(slow, tmp_path, score_concurrency=2)) as (hot, gw), \
                client(hot.app) as api:
            begun = asyncio.create_task(
                api.post("/v1/score", json={"scorer": "length", "items": items}))
            async with asyncio.timeout(10):
                while gw.pool.replicas[0].gate.inflight == 0:
                    await asyncio.sleep(0.01)
            gw.draining = True
            late = await api.post("/v1/score", json={"scorer": "length", "items": items[:1]})
            counted = gw.batches, gw.inflight
            answer = await begun
            after = gw.batches, gw.inflight
    finally:
        slow.stop()
    assert late.status_code == 503 and "shutting down" in late.text
    assert answer.status_code == 200, answer.text
    assert [r["status"] for r in answer.json()["results"]] == ["ok"] * 6
    # the begun batch is counted as one, beside its items' engine requests, until answered
    assert counted[0] == 1 and counted[1] > counted[0] and after == (0, 0)


async def test_the_scorers_max_tokens_is_capped_unless_the_batch_sets_its_own(
    stub: Proc, tmp_path: Path
) -> None:
    item = {"id": "a", "completion": "x"}
    async with serving(settings(stub, tmp_path, score_max_tokens=5)) as (hot, _), \
            client(hot.app) as api:
        await received(stub.url)
        caps = (await api.get("/v1/capabilities")).json()
        capped = await api.post("/v1/score", json={"scorer": "length", "items": [item]})
        own = await api.post("/v1/score", json={"scorer": "length", "items": [item],
                                                "sampling": {"max_tokens": 9}})
        sent = await received(stub.url)
    assert capped.status_code == own.status_code == 200, (capped.text, own.text)
    assert caps["score_max_tokens"] == 5
    # The length scorer asks for 12: the engine gets the cap, or what the batch asked for.
    assert [s["body"]["max_tokens"] for s in sent] == [5, 9]
    digests = [r.json()["results"][0]["fingerprint"]["request_digest"] for r in (capped, own)]
    assert digests[0] != digests[1], "the cap is part of the request on record"
