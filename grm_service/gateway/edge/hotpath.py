"""The hot routes, `POST /v1/chat/completions` and `POST /classify`, and their one door.

Every request of an RL step goes through one of these, so they skip what a framework adds per
request (routing table, dependency injection, a pydantic round trip of the whole body, a
middleware chain) and keep the product's own work, in this order:

    admission -> body limit + JSON shape -> parse -> validate -> proxy.forward -> render
    -> metrics

`proxy.forward` does the same for every path: the checkpoint (`checkpoint.check_body`, images
included), route digest and request digest from one canonical serialisation, backpressure
(per-replica gate, bounded queue -> 429), breaker, failover, fingerprint, audit. A body of
`longstrings.LONG` bytes or more (an image) is parsed by `longstrings.loads`, which leaves its
long strings out of the parse and hands them to `forward` (`Lifted`), so no pass over the image
is made character by character.

Every answer to these routes comes from `HotPath.serve`, refusals included, whichever edge
read the request (the one-write exchange of `protocol.py`, the ASGI adapter here, the FastAPI
routes that give the OpenAPI schema): admission (`admission.py`: 401, a repeated header's 400,
413), 503 while the gateway starts, 413 for a body read past the limit, 400 for a body that is
not JSON or is past the shape bounds (`bad_json.py` words it), 422 from the schema's rules
(`rules.py`: a fast check derived from the pydantic model, and pydantic itself when the fast
check fails). Answers and errors are rendered by `replies.py` and counted by `RequestMetrics`.
What the fast parsers do not take (non-finite numbers, a byte order mark) is parsed as FastAPI
parses a body, so it gets the answer FastAPI gave. `tests/unit/gateway/edge/test_hotpath.py`
checks that what the fast path takes on gives the same bytes as pydantic.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import msgspec
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from grm_service.errors import GrmError, ServiceUnavailable, TooLarge
from grm_service.gateway.edge.bad_json import invalid_json
from grm_service.gateway.edge.guards import HEAD, read_body
from grm_service.gateway.edge.head import Asker, Headers, RequestHead
from grm_service.gateway.edge.replies import (
    Reply,
    answer_reply,
    error_reply,
    send_reply,
    validation_reply,
)
from grm_service.gateway.edge.rules import CHAT_RULES, CLASSIFY_RULES, NotPlain
from grm_service.gateway.request import longstrings
from grm_service.gateway.request.answer import Forwarded
from grm_service.gateway.request.proxy import forward, prepare
from grm_service.gateway.request.send import pooling_body
from grm_service.gateway.request.shape import check_json_shape
from grm_service.gateway.service import Service
from grm_service.ledger.records import Origin

CHAT = "/v1/chat/completions"
CLASSIFY = "/classify"


# ---- parse ----------------------------------------------------------------------------------

def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e999: pydantic's JSON mode renders infinities its own way
        raise NotPlain
    return value


def _no_constant(_: str) -> Any:
    raise NotPlain  # NaN / Infinity literals: same reason


_DECODER = json.JSONDecoder(parse_float=_finite, parse_constant=_no_constant)
# msgspec first: for every document it takes it builds the stdlib's values (jsonload.py, held to
# that by test_jsonload.py), at a quarter of the CPU for a chat body. What it refuses (NaN,
# numbers past the float range, lone surrogates, invalid UTF-8, ...) gets the stdlib's verdict.
_STRICT = msgspec.json.Decoder()


def load_json(raw: bytes | bytearray, lifted: longstrings.Lifted | None = None,
              escaped: bool = True, strings: list[tuple[int, int]] | None = None) -> Any:
    """The body as Python values, or NotPlain: invalid UTF-8/JSON, non-finite numbers.
    Long strings (images) are parsed by copying them, and noted in `lifted`. `escaped=False`:
    `raw` holds no backslash; `strings`: where its long strings are (`_bounded`)."""
    try:
        if len(raw) >= longstrings.LONG:
            return longstrings.loads(raw, _finite, lifted, escaped, strings)
        try:
            return _STRICT.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            return _DECODER.decode(raw.decode())
    except ValueError:  # UnicodeDecodeError, JSONDecodeError and a NaN literal are ValueErrors
        raise NotPlain from None


def _bounded(raw: bytes | bytearray, max_depth: int, max_values: int,
             escaped: bool) -> list[tuple[int, int]] | None:
    """Guards' shape bounds, before any parser recurses into the body; FastAPI words a refusal.
    Where the body's long strings are, where the bounds' scan found them."""
    try:
        return check_json_shape(raw, max_depth, max_values, escaped)
    except GrmError:
        raise NotPlain from None


def parse(raw: bytes | bytearray, max_depth: int,
          max_values: int) -> tuple[Any, longstrings.Lifted | None]:
    """The body within the shape bounds, as Python values, and the long strings lifted out of
    its parse; NotPlain where the fast parsers do not take it (`HotPath._parse` then decides)."""
    # One pass for a backslash, which the surrogate check and the parse both ask about, and one
    # for the strings, which the shape bound and the parse both need.
    escaped = raw.find(b"\\") >= 0
    strings = _bounded(raw, max_depth, max_values, escaped)
    lifted = longstrings.Lifted() if len(raw) >= longstrings.LONG else None
    return load_json(raw, lifted, escaped, strings), lifted


# ---- the door -------------------------------------------------------------------------------

class HotPath:
    """The one door of the hot routes: `serve` answers every request to them, refusals
    included. As an ASGI app it is a thin adapter over `serve`, and passes every other request
    to `app`; the protocol (`edge/protocol.py`, the one-write exchange) and the FastAPI routes
    (there for the OpenAPI schema) call `serve` too."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service
        self.requests = service.requests
        self.admission = service.admission
        self.settings = service.settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or scope["method"] != "POST" or path not in (CHAT, CLASSIFY):
            await self.app(scope, receive, send)
            return
        head = scope.get(HEAD) or RequestHead(scope["headers"])
        body: bytes | None = b""  # refused from its head: answered without reading the body
        if isinstance(self.admission.admit(head, path), Asker):
            body = await read_body(receive, self.admission.limit)
        if body is not None:  # else the client went away
            await send_reply(send, await self.serve(path, head, body))

    async def serve(self, path: str, head: RequestHead, raw: bytes | bytearray) -> Reply:
        """The answer to a request to `path` (`CHAT` or `CLASSIFY`) whose head is `head` and
        whose body, as read, is `raw` (longer than the body limit: too large)."""
        start = time.perf_counter()
        replica = ""
        try:
            asker = self.admission.admit(head, path)
            if not isinstance(asker, Asker):
                reply = asker
            else:
                answer = await self._forward(path, head, asker, raw)
                reply, replica = answer_reply(answer), answer.fields["replica"]
        except ValidationError as err:
            reply = validation_reply(err.errors())
        except GrmError as err:
            reply = error_reply(err)
        self.requests.record(path, reply[0], replica, time.perf_counter() - start)
        return reply

    async def _forward(self, path: str, head: RequestHead, asker: Asker,
                       raw: bytes | bytearray) -> Forwarded:
        gw = self.service.gateway
        if gw is None:
            raise self.service.refusals.refuse("starting", starting())
        limit = self.admission.limit
        if len(raw) > limit:
            raise TooLarge(f"body exceeds the limit of {limit} bytes")
        body, lifted = self._parse(head, raw)
        if path == CHAT:
            prepared = prepare(CHAT_RULES.apply(body), gw.request_settings)
        else:
            prepared = pooling_body(CLASSIFY_RULES.apply(body), gw.request_settings.model_name)
        # The checkpoint runs inside `forward`, on the body as prepared: one place for all paths.
        origin = Origin.of(path, asker.key, head.run, head.step)
        return await forward(gw, path, prepared, head.pin, lifted=lifted, origin=origin)

    def _parse(self, head: RequestHead,
               raw: bytes | bytearray) -> tuple[Any, longstrings.Lifted | None]:
        """The body as the rules take it; a GrmError (400) where it is not JSON or past the
        shape bounds."""
        if not head.json:
            return bytes(raw), None  # as FastAPI hands such a body on: pydantic refuses it
        settings = self.settings
        try:
            return parse(raw, settings.max_json_depth, settings.max_json_values)
        except NotPlain:
            pass
        check_json_shape(raw, settings.max_json_depth, settings.max_json_values)
        # What the fast parsers leave (non-finite numbers, a byte order mark, ...) is parsed as
        # FastAPI parses a body; what it refuses too is worded from its bytes.
        try:
            return json.loads(raw), None
        except ValueError:
            raise invalid_json(bytes(raw)) from None


def starting() -> ServiceUnavailable:
    """The refusal of a request that comes before the lifespan built the request side."""
    return ServiceUnavailable("the gateway is starting (its replicas are not looked at yet): "
                              "retry in a second; GET /ready says when it serves",
                              retry_after=1)


__all__ = ["CHAT", "CLASSIFY", "HEAD", "Headers", "HotPath", "Reply", "load_json"]
