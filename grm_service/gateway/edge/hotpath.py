"""The hot routes, served in front of FastAPI: `POST /v1/chat/completions` and `POST /classify`.

Every request of an RL step goes through one of these, so they skip what a framework adds per
request (routing table, dependency injection, a pydantic round trip of the whole body, a
middleware chain) and keep the product's own work, in this order:

    auth + body limit + JSON shape -> parse -> validate -> proxy.forward -> render -> metrics

`proxy.forward` does the same for every path: the checkpoint (`checkpoint.check_body`, images
included), routing key and request digest from one canonical serialisation, backpressure
(per-replica gate, bounded queue -> 429), breaker, failover, fingerprint, audit. A body of
`longstrings.LONG` bytes or more (an image) is parsed by `longstrings.loads`, which leaves its
long strings out of the parse and hands them to `forward` (`Lifted`), so no pass over the image
is made character by character.

Validation is the schema's own (`rules.py`: a fast check derived from the pydantic model, and
pydantic itself when the fast check fails, so a refusal is the same 422); answers and errors
are rendered by `replies.py` and counted by `RequestMetrics`, as on the FastAPI routes. What is
not admitted (no gateway yet, a refused key, a repeated header, not JSON, too large) and what
does not parse (invalid JSON or UTF-8, non-finite numbers, past the JSON shape bounds) is handed
to the FastAPI app untouched, body included, where `Guards` and FastAPI word the refusal.
`tests/unit/gateway/edge/test_hotpath.py` checks that what it takes on gives the same bytes as
pydantic.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import msgspec
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from grm_service.errors import GrmError
from grm_service.gateway.edge.guards import HEAD, key_ok, presented_key
from grm_service.gateway.edge.head import Headers, RequestHead
from grm_service.gateway.edge.replies import (
    Reply,
    answer_reply,
    error_reply,
    send_reply,
    validation_reply,
)
from grm_service.gateway.edge.rules import CHAT_RULES, CLASSIFY_RULES, NotPlain
from grm_service.gateway.request import longstrings
from grm_service.gateway.request.checkpoint import check_json_shape
from grm_service.gateway.request.proxy import Gateway, forward, prepare
from grm_service.gateway.service import Service
from grm_service.ledger.records import Origin
from grm_service.scoring.send import pooling_body

CHAT = "/v1/chat/completions"
CLASSIFY = "/classify"
# Set in the ASGI scope by the protocol (edge/protocol.py), so that admission runs once:
# `admit`'s answer (a Gateway, or None: left to FastAPI). `HEAD` is the parsed head.
ADMITTED = "grm.admitted"


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
    its parse; NotPlain where FastAPI must take it."""
    # One pass for a backslash, which the surrogate check and the parse both ask about, and one
    # for the strings, which the shape bound and the parse both need.
    escaped = raw.find(b"\\") >= 0
    strings = _bounded(raw, max_depth, max_values, escaped)
    lifted = longstrings.Lifted() if len(raw) >= longstrings.LONG else None
    return load_json(raw, lifted, escaped, strings), lifted


# ---- the ASGI app ---------------------------------------------------------------------------

class HotPath:
    """ASGI app: serves the hot routes itself and passes every other request to `app`.

    A server can also call `admit` and `serve` directly, without ASGI messages
    (`edge/protocol.py` does, for the one-write exchange)."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service
        self.requests = service.requests
        settings = service.settings
        self.limit = settings.max_body_bytes
        self.max_depth = settings.max_json_depth
        self.max_values = settings.max_json_values
        self.keys = [key.encode() for key in settings.all_api_keys()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or scope["method"] != "POST" or path not in (CHAT, CLASSIFY):
            await self.app(scope, receive, send)
            return
        head = scope.get(HEAD) or RequestHead(scope["headers"])
        gw = scope[ADMITTED] if ADMITTED in scope else self.admit(head)
        if gw is None:
            await self.app(scope, receive, send)  # FastAPI words the refusal
            return
        chunks, complete = await self._read(receive)
        if not complete:
            await self.app(scope, _replay(chunks, receive, complete=False), send)
            return
        reply = await self.serve(path, gw, head, b"".join(chunks))
        if reply is None:
            await self.app(scope, _replay(chunks, receive, complete=True), send)
            return
        await send_reply(send, reply)

    def admit(self, head: RequestHead) -> Gateway | None:
        """The gateway, when the hot path may read the request's body; None leaves it to
        FastAPI (no gateway yet, a refused key, a repeated header, not JSON, too large)."""
        gw = self.service.gateway
        refused = self.keys and not key_ok(head.authorization, self.keys)
        if gw is None or refused or head.repeated or not head.json:
            return None
        return gw if head.content_length <= self.limit else None

    async def serve(self, path: str, gw: Gateway, head: RequestHead,
                    raw: bytes | bytearray) -> Reply | None:
        """The answer to an admitted request whose whole body is `raw`; None when FastAPI must
        take it (a body that does not parse)."""
        start = time.perf_counter()
        try:
            body, lifted = parse(raw, self.max_depth, self.max_values)
        except NotPlain:
            return None
        try:
            if path == CHAT:
                prepared = prepare(CHAT_RULES.apply(body), gw.path_settings)
            else:
                prepared = pooling_body(CLASSIFY_RULES.apply(body), gw.path_settings.model_name)
            # The checkpoint runs inside `forward`, on the body as prepared: one place for all
            # paths.
            answer = await forward(gw, path, prepared, head.pin, lifted=lifted,
                                   origin=_origin(head, path))
        except ValidationError as err:
            reply, replica = validation_reply(err.errors()), ""
        except GrmError as err:
            reply, replica = error_reply(err), ""
        else:
            reply, replica = answer_reply(answer), answer.fields["replica"]
        self.requests.record(path, reply[0], replica, time.perf_counter() - start)
        return reply

    async def _read(self, receive: Receive) -> tuple[list[bytes], bool]:
        """The body's chunks, and whether it ended within the limit (else FastAPI refuses it)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return chunks, False
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if size > self.limit:
                return chunks, False
            if not message.get("more_body", False):
                return chunks, True


def _origin(head: RequestHead, route: str) -> Origin:
    """Who asks (the API key's id) and the client's run and step tags, for the ledger."""
    return Origin.of(route, presented_key(head.authorization), head.run, head.step)


def _replay(chunks: list[bytes], receive: Receive, complete: bool) -> Receive:
    """A `receive` that gives the body read so far again, then whatever is left."""
    pending = [b"".join(chunks)] if complete else list(chunks)

    async def replayed() -> Message:
        if pending:
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": not complete}
        return await receive()

    return replayed


__all__ = ["ADMITTED", "CHAT", "CLASSIFY", "HEAD", "Headers", "HotPath", "Reply", "load_json"]
