"""Every refusal of the hot routes comes from one door (`HotPath.serve`), so each one is the
same answer through every way in: the protocol's one-write exchange (on a mock transport), the
hot path as an ASGI app, and the FastAPI routes behind it (there for the OpenAPI schema).

Before the one door these differed: a `null` body got "Input should be a valid dictionary"
from the hot path and "Field required" from FastAPI, and a request the hot path did not admit
went round through FastAPI's own refusals.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import httpx
import pytest

from grm_service.config import Settings
from grm_service.gateway.app import create_app
from grm_service.gateway.edge.hotpath import CHAT, CLASSIFY, HotPath
from grm_service.gateway.request.context import ForwardContext
from grm_service.gateway.request.upstream import Upstream
from grm_service.gateway.service import Service
from grm_service.replicas.identity import ServiceIdentity
from grm_service.replicas.pool import ReplicaPool
from tests.unit.gateway.edge.test_protocol import Connection, post

LIMIT = 65600
KEY = "door-key"
AUTH = f"authorization: Bearer {KEY}"
Answer = tuple[int, dict[str, str], bytes]


def service(started: bool = True) -> Service:
    settings = Settings(model="m", served_model_name="rm", api_keys=[KEY], max_body_bytes=LIMIT,
                        max_image_bytes=1, max_json_depth=16)
    built = Service(settings)
    if started:  # the request side, with no replica: every case here is refused before one
        built.start(ForwardContext(settings=settings, pool=ReplicaPool([]), client=Upstream(1.0),
                            metrics=built.metrics, identity=ServiceIdentity(settings)))
    return built


def _split(raw: bytes) -> Answer:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return int(status_line.split()[1]), headers, body


async def through_protocol(hot: HotPath, raw: bytes) -> Answer:
    connection = Connection(cast(Any, hot), cast(Any, hot.app))
    try:
        return _split(await connection.send(raw))
    finally:
        connection.close()


async def through_asgi(app: Any, raw: bytes) -> Answer:
    """`raw` (one request as `post` writes it) through an ASGI app, by httpx."""
    head, _, body = raw.partition(b"\r\n\r\n")
    request_line, *lines = head.decode("latin-1").split("\r\n")
    method, target, _ = request_line.split(" ")
    headers = [tuple(line.split(": ", 1)) for line in lines
               if not line.startswith(("host:", "content-length:"))]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gw") as client:
        answer = await client.request(method, target, content=body, headers=headers)
    return answer.status_code, dict(answer.headers), answer.content


DOORS: dict[str, Callable[[HotPath, bytes], Any]] = {
    "protocol": through_protocol,
    "asgi": through_asgi,
    "fastapi": lambda hot, raw: through_asgi(hot.app, raw),
}

MSG = {"messages": [{"role": "user", "content": "hi"}]}
# (request, the status, words of the message, a header the refusal carries)
REFUSALS: dict[str, tuple[bytes, int, str, str | None]] = {
    "no key": (post(CHAT, json.dumps(MSG).encode()), 401, "missing or invalid API key",
               "www-authenticate"),
    "a wrong key": (post(CLASSIFY, b"{}", "authorization: Bearer nope"), 401,
                    "missing or invalid API key", "www-authenticate"),
    "a repeated header": (post(CHAT, b"{}", AUTH, AUTH), 400,
                          "'authorization' sent more than once", None),
    "declared too large": (post(CHAT, b" " * (LIMIT + 1), AUTH), 413,
                           f"the limit is {LIMIT}", None),
    "not JSON": (post(CHAT, b'{"messages": [', AUTH), 400, "line 1", None),
    "not UTF-8": (post(CHAT, b'{"messages": "\xff"}', AUTH), 400, "UTF-8", None),
    "too deep": (post(CHAT, b"[" * 17 + b"]" * 17, AUTH), 400, "GRM_MAX_JSON_DEPTH", None),
    "schema": (post(CHAT, b'{"messages": "hi"}', AUTH), 422, "messages: Input should be",
               None),
    "null": (post(CHAT, b"null", AUTH), 422, "valid dictionary", None),
    "null, classify": (post(CLASSIFY, b"null", AUTH), 422, "valid dictionary", None),
    "a list": (post(CLASSIFY, b"[1]", AUTH), 422, "valid dictionary", None),
    "not a JSON type": (post(CHAT, json.dumps(MSG).encode(), AUTH, content_type="text/plain"),
                        422, "valid dictionary", None),
}


@pytest.fixture
async def hot() -> AsyncIterator[HotPath]:
    yield create_app(service())


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("case", REFUSALS)
async def test_each_refusal_through_each_door(hot: HotPath, case: str, door: str) -> None:
    raw, status, words, header = REFUSALS[case]
    got, headers, body = await DOORS[door](hot, raw)
    assert got == status, body
    message = json.loads(body)["error"]["message"]
    assert words in message
    if header is not None:
        assert header in headers


@pytest.mark.parametrize("case", REFUSALS)
async def test_each_refusal_is_the_same_bytes_from_every_door(hot: HotPath, case: str) -> None:
    raw = REFUSALS[case][0]
    answers = {door: await through(hot, raw) for door, through in DOORS.items()}
    bodies = {door: answer[2] for door, answer in answers.items()}
    assert len(set(bodies.values())) == 1, bodies
    assert len({answer[0] for answer in answers.values()}) == 1


@pytest.mark.parametrize("door", DOORS)
async def test_while_starting_every_door_says_so_with_retry_after(door: str) -> None:
    starting = create_app(service(started=False))
    status, headers, body = await DOORS[door](starting, post(CHAT, json.dumps(MSG).encode(),
                                                             AUTH))
    assert status == 503 and headers["retry-after"] == "1"
    assert "the gateway is starting" in json.loads(body)["error"]["message"]


async def test_every_refusal_is_counted_by_route_and_status(hot: HotPath) -> None:
    for door in DOORS.values():
        await door(hot, REFUSALS["null"][0])
    requests = hot.service.metrics.requests.labels(route=CHAT, status="422", replica="")
    hot.service.metrics.tally.flush()
    assert requests._value.get() == 3
