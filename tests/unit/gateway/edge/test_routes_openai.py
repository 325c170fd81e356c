"""The OpenAI routes of the FastAPI app, driven in process, with a STUB replica behind them.

The FastAPI app is called directly (not the hot path in front of it), so these are the
route's own answers; one test holds the hot path's answer to the route's, byte for byte.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from grm_service.config import Settings
from tests.support.gateway import client, received, serving
from tests.support.procs import Proc

MSGS = [{"role": "user", "content": "hello"}]


def settings(stub: Proc, tmp_path: Path, **over: Any) -> Settings:
    return Settings(replica_urls=[stub.url], served_model_name="rm", seed=11,
                    max_tokens_default=77, work_dir=tmp_path, **over)


async def test_chat_is_forwarded_prepared_and_answered_with_its_fingerprint(
    stub: Proc, tmp_path: Path
) -> None:
    async with serving(settings(stub, tmp_path)) as (hot, _), client(hot.app) as api:
        await received(stub.url)  # the canary's probes
        r = await api.post("/v1/chat/completions", json={"messages": MSGS, "top_k": 5})
        assert r.status_code == 200, r.text
        (sent,) = await received(stub.url)
    assert sent == {"path": "/v1/chat/completions",
                    "body": {"messages": MSGS, "top_k": 5, "seed": 11, "max_tokens": 77,
                             "model": "rm"}}
    body = r.json()
    fp = body["grm_fingerprint"]
    assert body["choices"][0]["message"]["content"].startswith("stub-")
    assert fp["fingerprint_id"] == r.headers["x-grm-fingerprint"]
    assert body["system_fingerprint"].startswith("grm-unverified-sys-")
    assert fp["replica"] == r.headers["x-grm-replica"] == "r0"
    assert fp["seed"] == 11 and r.headers["x-grm-seed"] == "11"
    assert fp["identity"] == "unverified"  # the stub serves no grm identity


async def test_the_hot_path_answers_the_routes_bytes(stub: Proc, tmp_path: Path) -> None:
    request = {"messages": MSGS, "seed": 3, "temperature": 0.5}
    async with serving(settings(stub, tmp_path)) as (hot, _), client(hot.app) as route, \
            client(hot) as fast:
        slow, quick = (await route.post("/v1/chat/completions", json=request),
                       await fast.post("/v1/chat/completions", json=request))
        await received(stub.url)
    assert slow.status_code == quick.status_code == 200
    assert slow.content == quick.content
    assert slow.headers == quick.headers


async def test_refusals_are_openai_error_objects(stub: Proc, tmp_path: Path) -> None:
    async with serving(settings(stub, tmp_path)) as (hot, _), client(hot.app) as api:
        await received(stub.url)
        streaming = await api.post("/v1/chat/completions", json={"messages": MSGS,
                                                                  "stream": True})
        other = await api.post("/v1/chat/completions", json={"messages": MSGS, "model": "x"})
        empty = await api.post("/v1/chat/completions", json={"messages": []})
        pinned = await api.post("/v1/chat/completions", json={"messages": MSGS},
                                headers={"x-grm-pin-replica": "r9"})
        nowhere = await api.post("/v1/completions", json={"prompt": "x"})
        method = await api.get("/v1/chat/completions")
        assert await received(stub.url) == [], "nothing refused reaches the replica"
    assert streaming.status_code == 400 and "stream=false" in streaming.json()["error"]["message"]
    assert other.status_code == 404 and "'x' is not served here" in other.json()["error"]["message"]
    assert other.json()["error"]["type"] == "not_found_error"
    assert other.json()["error"]["code"] == "unknown_model"
    assert empty.status_code == 422
    assert empty.json()["error"]["param"] == "messages"
    assert empty.json()["error"]["type"] == "invalid_request_error"
    assert empty.json()["error"]["code"] == "invalid_fields"
    assert pinned.status_code == 400 and "r9" in pinned.json()["error"]["message"]
    assert pinned.json()["error"]["code"] == "unknown_replica"
    assert nowhere.status_code == 404 and nowhere.json()["error"] == {
        "message": "no route for POST /v1/completions: the routes are listed at /docs",
        "type": "not_found_error", "param": None, "code": "unknown_route"}
    assert method.status_code == 405 and method.headers["allow"] == "POST"
    assert method.json()["error"]["code"] == "method_not_allowed"


async def test_a_pin_sends_the_request_to_that_replica(stub: Proc, tmp_path: Path) -> None:
    two = settings(stub, tmp_path).model_copy(update={"replica_urls": [stub.url, stub.url]})
    async with serving(two) as (hot, _), client(hot.app) as api:
        answers = [await api.post("/v1/chat/completions", json={"messages": MSGS},
                                  headers={"x-grm-pin-replica": name}) for name in ("r0", "r1")]
        await received(stub.url)
    assert [a.headers["x-grm-replica"] for a in answers] == ["r0", "r1"]
    assert answers[0].json()["choices"] == answers[1].json()["choices"]


async def test_models_lists_the_served_model(stub: Proc, tmp_path: Path) -> None:
    async with serving(settings(stub, tmp_path, model="/models/m")) as (hot, _), \
            client(hot.app) as api:
        card = cast(dict[str, Any], (await api.get("/v1/models")).json())
        await received(stub.url)
    assert card == {"object": "list", "data": [
        {"id": "rm", "object": "model", "owned_by": "grm-service", "root": "/models/m"}]}
