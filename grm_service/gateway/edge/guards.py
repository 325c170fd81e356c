"""Repeated singleton headers, bearer-key auth, body-size limit and JSON shape bounds as plain
ASGI middleware (before any body is parsed: a parser given a 900-deep or million-value body
recurses or allocates first and fails later)."""

from __future__ import annotations

import base64
import binascii
import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from grm_service.config import Settings
from grm_service.errors import BadHeader, GrmError, TooLarge, Unauthorized
from grm_service.gateway.edge.head import RequestHead
from grm_service.gateway.edge.replies import error_reply, send_reply
from grm_service.gateway.request.checkpoint import check_json_shape

OPEN_PATHS = frozenset({"/health", "/ready"})
# Open unless GRM_METRICS_AUTH: the gateway's metrics, and the engines' relayed (routes_engines).
METRICS_PATHS = frozenset({"/metrics", "/metrics/targets", "/metrics/engine"})
# Set in the ASGI scope's state: whether the request carried a valid key (or none is needed).
# Open paths read it to decide how much to show (e.g. /ready's replica details).
AUTHORIZED = "grm_authorized"
# Set in the scope by the protocol (edge/protocol.py): the request's head, parsed once.
HEAD = "grm.head"


async def _refuse(send: Send, err: GrmError, headers: dict[str, str] | None = None) -> None:
    await send_reply(send, error_reply(err, headers))


def presented_key(header: bytes) -> bytes | None:
    """The key in `Bearer <key>`, or the password of `Basic` credentials: clients that send no
    headers of their own (OpenRLHF) can carry the key in the URL, `http://user:<key>@host/`,
    which aiohttp and httpx send as Basic."""
    scheme, _, value = header.partition(b" ")
    if scheme.lower() == b"bearer":
        return value.strip()
    if scheme.lower() == b"basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True)
        except binascii.Error:
            return None
        return decoded.partition(b":")[2]
    return None


def key_ok(header: bytes, keys: list[bytes]) -> bool:
    """The Authorization header presents one of `keys`."""
    token = presented_key(header)
    if token is None:
        return False
    # Compare against every key, always: the time taken must not tell which one matched.
    matches = [hmac.compare_digest(token, key) for key in keys]
    return any(matches)


class Guards:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.limit = settings.max_body_bytes
        self.max_depth = settings.max_json_depth
        self.max_values = settings.max_json_values
        self.keys = [key.encode() for key in settings.all_api_keys()]
        self.open_paths = OPEN_PATHS if settings.metrics_auth else OPEN_PATHS | METRICS_PATHS

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        head: RequestHead = scope.get(HEAD) or RequestHead(scope["headers"])
        if head.repeated:
            await _refuse(send, BadHeader(f"header {head.repeated!r} sent more than once: "
                                          "send it once"))
            return
        has_key = not self.keys or key_ok(head.authorization, self.keys)
        scope.setdefault("state", {})[AUTHORIZED] = has_key
        if not has_key and scope["path"] not in self.open_paths:
            await _refuse(send, Unauthorized("missing or invalid API key: send 'Authorization: "
                                             "Bearer <key>' (or the key as the URL's password)"),
                          {"www-authenticate": "Bearer"})
            return
        if head.content_length > self.limit:
            await _refuse(send, TooLarge(f"body is {head.content_length} bytes; the limit is "
                                         f"{self.limit}"))
            return
        await self._limited(scope, receive, send)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the body up to the limit before the app sees it (the app would buffer it anyway);
        a chunked body gives no length up front."""
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await _refuse(send, TooLarge(f"body exceeds the limit of {self.limit} bytes"))
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            check_json_shape(body, self.max_depth, self.max_values)
        except GrmError as err:
            await _refuse(send, err)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)
