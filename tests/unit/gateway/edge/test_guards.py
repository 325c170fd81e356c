"""The guards at the edge: keys presented in headers or URLs, the body cap, the refusals' shape."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from grm_service.config import Settings
from grm_service.gateway.edge.admission import Admission, key_ok, presented_key
from grm_service.gateway.edge.guards import Guards, asker_of


def basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


@pytest.mark.parametrize(("header", "key"), [
    (b"Bearer k1", b"k1"),
    (b"bearer  k1 ", b"k1"),
    (basic("grm", "k1"), b"k1"),  # http://grm:k1@host/ as aiohttp and httpx send it
    (basic("", "k:with:colons"), b"k:with:colons"),
    (b"Basic not-base64!", None),
    (b"Token k1", None),
    (b"", None),
])
def test_presented_key(header: bytes, key: bytes | None) -> None:
    assert presented_key(header) == key


def test_key_ok_accepts_any_listed_key_and_nothing_else() -> None:
    keys = [b"k1", b"k2"]
    def ok(header: bytes) -> bool:
        return key_ok(presented_key(header), keys)

    assert ok(b"Bearer k2") and ok(basic("u", "k1"))
    assert not ok(b"Bearer k3") and not ok(b"") and not ok(b"Bearer k1x")


class Inner:
    """The app behind the guards: answers what it was given (body, and whether the asker is
    authorized)."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        payload = json.dumps({"body": body.decode(),
                              "authorized": asker_of(scope).authorized}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": payload})


LIMIT = 200_000


def guarded(inner: Inner, **settings: Any) -> httpx.AsyncClient:
    config = Settings(model="m", max_body_bytes=LIMIT, max_image_bytes=1000, max_json_depth=8,
                      **settings)
    guards = Guards(inner, config, Admission(config))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=guards), base_url="http://gw")


async def test_keys_guard_every_path_but_health_ready_and_metrics() -> None:
    inner = Inner()
    async with guarded(inner, api_keys=["k1"]) as api:
        refused = await api.post("/v1/score", content=b"{}")
        health = await api.get("/health")
        metrics = await api.get("/metrics")
        keyed = await api.post("/v1/score", content=b"{}", headers={"authorization": "Bearer k1"})
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert refused.json()["error"]["type"] == "authentication_error"
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert health.json() == metrics.json() == {"body": "", "authorized": False}
    assert keyed.json() == {"body": "{}", "authorized": True}
    assert inner.calls == 3
    async with guarded(Inner(), api_keys=["k1"], metrics_auth=True) as api:
        assert (await api.get("/metrics")).status_code == 401
    async with guarded(Inner()) as api:
        assert (await api.get("/v1/models")).json()["authorized"] is True, "no keys set"


async def test_bodies_over_the_limit_are_refused_declared_or_streamed() -> None:
    inner = Inner()

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(3):
            yield b" " * (LIMIT // 2)

    async with guarded(inner) as api:
        declared = await api.post("/v1/score", content=b" " * (LIMIT + 1))
        streamed = await api.post("/v1/score", content=chunks())
        at_limit = await api.post("/v1/score", content=b" " * LIMIT)
    assert declared.status_code == 413
    assert declared.json()["error"]["message"] == f"body is {LIMIT + 1} bytes; the limit is {LIMIT}"
    assert streamed.status_code == 413 and "exceeds the limit" in streamed.text
    assert at_limit.status_code == 200 and len(at_limit.json()["body"]) == LIMIT
    assert inner.calls == 1


async def test_too_deep_json_is_refused_before_the_app_parses_it() -> None:
    inner = Inner()
    async with guarded(inner) as api:
        deep = await api.post("/v1/chat/completions", content=b"[" * 9 + b"]" * 9)
        fine = await api.post("/v1/chat/completions", content=b"[" * 8 + b"]" * 8)
    assert deep.status_code == 400 and "GRM_MAX_JSON_DEPTH" in deep.text
    assert fine.json()["body"] == "[" * 8 + "]" * 8
    assert inner.calls == 1


async def test_a_singleton_header_sent_twice_is_refused_naming_it() -> None:
    inner = Inner()
    async with guarded(inner) as api:
        twice = await api.post("/v1/score", content=b"{}", headers=[
            ("authorization", "Bearer a"), ("authorization", "Bearer b")])
        once = await api.post("/v1/score", content=b"{}", headers={"authorization": "Bearer a"})
    assert twice.status_code == 400 and "'authorization' sent more than once" in twice.text
    assert once.status_code == 200 and inner.calls == 1
