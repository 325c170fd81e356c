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

Anything this module does not take on exactly as the FastAPI route would (a refused key, an
oversized or non-JSON body, a field of an unusual type, a failed constraint) is handed to the
FastAPI app untouched, body included, so error messages and edge cases keep one implementation.
`tests/unit/gateway/edge/test_hotpath.py` checks that what it takes on gives the same bytes as
pydantic.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from grm_service.config import Settings
from grm_service.errors import GrmError, error_body
from grm_service.fingerprint import fingerprint_headers
from grm_service.gateway.edge.guards import key_ok, presented_key
from grm_service.gateway.request import longstrings
from grm_service.gateway.request.answer import RESPONSE_JSON, render
from grm_service.gateway.request.checkpoint import check_json_shape
from grm_service.gateway.request.proxy import Gateway, forward, prepare
from grm_service.headers import PIN_HEADER, RUN_HEADER, STEP_HEADER
from grm_service.ledger.records import Origin
from grm_service.metrics import Metrics
from grm_service.scoring.send import pooling_body

CHAT = "/v1/chat/completions"
CLASSIFY = "/classify"
_INT64 = 2**63 - 1
_PIN = PIN_HEADER.encode()
_RUN, _STEP = RUN_HEADER.encode(), STEP_HEADER.encode()


class _NotPlain(Exception):
    """A body the fast path leaves to FastAPI (its validation decides and words the error)."""


# ---- parse and validate ---------------------------------------------------------------------

def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e999: pydantic's JSON mode renders infinities its own way
        raise _NotPlain
    return value


def _no_constant(_: str) -> Any:
    raise _NotPlain  # NaN / Infinity literals: same reason


_DECODER = json.JSONDecoder(parse_float=_finite, parse_constant=_no_constant)


def load_json(raw: bytes, lifted: longstrings.Lifted | None = None) -> Any:
    """The body as Python values, or _NotPlain: invalid UTF-8/JSON, non-finite numbers.
    Long strings (images) are parsed by copying them, and noted in `lifted`."""
    try:
        if len(raw) >= longstrings.LONG:
            return longstrings.loads(raw, _finite, lifted)
        return _DECODER.decode(raw.decode())
    except ValueError:  # UnicodeDecodeError, JSONDecodeError and a NaN literal are ValueErrors
        raise _NotPlain from None


def _bounded(raw: bytes, max_depth: int, max_values: int) -> None:
    """Guards' shape bounds, before any parser recurses into the body; FastAPI words a refusal."""
    try:
        check_json_shape(raw, max_depth, max_values)
    except GrmError:
        raise _NotPlain from None


def _int(value: Any, low: int, high: int = _INT64) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not low <= value <= high:  # bool is an int subclass: refused
        raise _NotPlain
    return value


def _float(value: Any, above: float, high: float, inclusive_low: bool) -> float | None:
    if value is None:
        return None
    if type(value) is int and abs(value) <= 2**53:
        value = float(value)  # pydantic turns 1 into 1.0, and the canonical JSON shows it
    if type(value) is not float:
        raise _NotPlain
    if not (value >= above if inclusive_low else value > above) or value > high:
        raise _NotPlain
    return value


# field -> check; the same constraints as api.schemas.ChatCompletionRequest, except `seed`:
# only a plain engine-range int passes here, anything else goes to FastAPI, whose checkpoint
# refuses it with a 400.
_CHAT_FIELDS: dict[str, Callable[[Any], Any]] = {
    "seed": lambda v: _int(v, 0),
    "max_tokens": lambda v: _int(v, 1),
    "max_completion_tokens": lambda v: _int(v, 1),
    "top_k": lambda v: _int(v, -1),
    "temperature": lambda v: _float(v, 0.0, math.inf, inclusive_low=True),
    "top_p": lambda v: _float(v, 0.0, 1.0, inclusive_low=False),
}


def plain_chat(body: Any) -> dict[str, Any]:
    """What `ChatCompletionRequest.model_validate(body).model_dump(exclude_unset=True,
    mode="json")` returns, for the bodies whose fields all have their plain JSON types."""
    if type(body) is not dict:
        raise _NotPlain
    messages = body.get("messages")
    if type(messages) is not list or not messages or any(type(m) is not dict for m in messages):
        raise _NotPlain
    if type(body.get("model")) not in (str, type(None)):
        raise _NotPlain
    if type(body.get("stream")) not in (bool, type(None)):
        raise _NotPlain
    out = dict(body)
    for name, check in _CHAT_FIELDS.items():
        if name in out:
            out[name] = check(out[name])
    return out


# ---- the ASGI app ---------------------------------------------------------------------------

class _Request:
    """The few headers the hot path reads, found in one pass."""

    __slots__ = ("authorization", "content_length", "json", "pin", "run", "step")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.authorization = b""
        self.content_length = -1
        self.json = False
        self.pin: str | None = None
        self.run: str | None = None
        self.step: str | None = None
        for key, value in headers:
            if key == b"content-type":
                self.json = value.split(b";", 1)[0].strip().lower() == b"application/json"
            elif key == b"content-length":
                self.content_length = int(value) if value.isdigit() else -1
            elif key == b"authorization":
                self.authorization = value
            elif key == _PIN:
                self.pin = value.decode("latin-1")
            elif key == _RUN:
                self.run = value.decode("latin-1")
            elif key == _STEP:
                self.step = value.decode("latin-1")

    def origin(self, route: str) -> Origin:
        return Origin.of(route, presented_key(self.authorization), self.run, self.step)


Headers = list[tuple[bytes, bytes]]
# An answer as the server writes it: status, headers (content-length included), body.
Reply = tuple[int, Headers, bytes]


class HotPath:
    """ASGI app: serves the hot routes itself and passes every other request to `app`.

    A server can also call `admit` and `serve` directly, without ASGI messages
    (`api/hotserver.py` does, for the one-write exchange)."""

    def __init__(self, app: ASGIApp, settings: Settings, state_of: Callable[[], Any]) -> None:
        self.app = app
        self.limit = settings.max_body_bytes
        self.max_depth = settings.max_json_depth
        self.max_values = settings.max_json_values
        self.keys = [key.encode() for key in settings.all_api_keys()]
        self._state_of = state_of  # the FastAPI app's `state`, where the lifespan puts the gateway
        self._metrics: Metrics | None = None
        self._counters: dict[tuple[str, int, str], Counter] = {}
        self._latency: dict[str, Histogram] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or scope["method"] != "POST" or path not in (CHAT, CLASSIFY):
            await self.app(scope, receive, send)
            return
        admitted = self.admit(scope["headers"])
        if admitted is None:
            await self.app(scope, receive, send)  # FastAPI words the refusal
            return
        chunks, complete = await self._read(receive)
        if not complete:
            await self.app(scope, _replay(chunks, receive, complete=False), send)
            return
        reply = await self.serve(path, *admitted, b"".join(chunks))
        if reply is None:
            await self.app(scope, _replay(chunks, receive, complete=True), send)
            return
        status, headers, body = reply
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def admit(self, headers: Headers) -> tuple[Gateway, _Request] | None:
        """The gateway and the request's headers, when the hot path may read its body; None
        leaves the request to FastAPI (no gateway yet, a refused key, not JSON, too large)."""
        gw = getattr(self._state_of(), "gateway", None)
        head = _Request(headers)
        refused = self.keys and not key_ok(head.authorization, self.keys)
        if gw is None or refused or not head.json or head.content_length > self.limit:
            return None
        return gw, head

    async def serve(self, path: str, gw: Gateway, head: _Request, raw: bytes) -> Reply | None:
        """The answer to an admitted request whose whole body is `raw`; None when FastAPI must
        take it (a body the fast path does not take on exactly)."""
        start = time.perf_counter()
        try:
            _bounded(raw, self.max_depth, self.max_values)
            lifted = longstrings.Lifted() if len(raw) >= longstrings.LONG else None
            body = load_json(raw, lifted)
            if path == CHAT:
                # The checkpoint runs inside `forward`, on the body as prepared: one place for
                # all paths.
                prepared = prepare(plain_chat(body), gw.settings)
            else:
                prepared = _pooling(body, gw)
            answer = await forward(gw, path, prepared, head.pin, lifted=lifted,
                                   origin=head.origin(path))
        except _NotPlain:
            return None
        except GrmError as err:
            # The same answer as the app's GrmError handler (api/app.py).
            retry = {"retry-after": str(max(1, round(err.retry_after)))} if err.retry_after else {}
            reply = _json_reply(err.http_status, error_body(err), retry)
            self._record(gw, path, err.http_status, "", start)
            return reply
        reply = _reply(200, render(answer), fingerprint_headers(answer.fields))
        self._record(gw, path, 200, answer.fields["replica"], start)
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

    def _record(self, gw: Gateway, path: str, status: int, replica: str, start: float) -> None:
        """The series MetricsMiddleware writes, with their label children cached (a `labels()`
        call takes a lock and builds tuples)."""
        if gw.metrics is not self._metrics:  # a new lifespan: new registry
            self._metrics, self._counters, self._latency = gw.metrics, {}, {}
        key = (path, status, replica)
        counter = self._counters.get(key)
        if counter is None:
            requests = gw.metrics.requests
            counter = self._counters[key] = requests.labels(route=path, status=str(status),
                                                            replica=replica)
        latency = self._latency.get(path)
        if latency is None:
            latency = self._latency[path] = gw.metrics.latency.labels(route=path)
        counter.inc()
        latency.observe(time.perf_counter() - start)


def _pooling(body: Any, gw: Gateway) -> dict[str, Any]:
    if type(body) is not dict:
        raise _NotPlain
    return pooling_body(body, gw.settings.model_name)


def _replay(chunks: list[bytes], receive: Receive, complete: bool) -> Receive:
    """A `receive` that gives the body read so far again, then whatever is left."""
    pending = [b"".join(chunks)] if complete else list(chunks)

    async def replayed() -> Message:
        if pending:
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": not complete}
        return await receive()

    return replayed


def _json_reply(status: int, content: Any, headers: dict[str, str]) -> Reply:
    return _reply(status, RESPONSE_JSON.encode(content).encode("utf-8"), headers)


def _reply(status: int, body: bytes, headers: dict[str, str]) -> Reply:
    # The headers JSONResponse sends, in its order.
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw += [(b"content-length", str(len(body)).encode()),
            (b"content-type", b"application/json")]
    return status, raw, body
