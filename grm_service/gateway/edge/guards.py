"""Admission (`admission.py`), the body-size limit of a chunked body and the JSON shape bounds
as plain ASGI middleware in front of FastAPI (before any body is parsed: a parser given a
900-deep or million-value body recurses or allocates first and fails later)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from grm_service.config import Settings
from grm_service.errors import GrmError, TooLarge
from grm_service.gateway.edge.admission import Admission
from grm_service.gateway.edge.head import Asker, RequestHead
from grm_service.gateway.edge.replies import error_reply, send_reply
from grm_service.gateway.request.shape import check_json_shape

# The request's head in the ASGI scope, parsed once (by the protocol, or here), its admission
# verdict with it: the routes' dependencies read who asks from it (`asker_of`).
HEAD = "grm.head"


def asker_of(scope: Scope) -> Asker:
    """Who asks, as admitted in front of the app (a request refused never reaches a route)."""
    head: RequestHead = scope[HEAD]
    verdict = head.admitted
    assert isinstance(verdict, Asker), "a route reached without admission"
    return verdict


class Guards:
    def __init__(self, app: ASGIApp, settings: Settings, admission: Admission) -> None:
        self.app = app
        self.admission = admission
        self.limit = settings.max_body_bytes
        self.max_depth = settings.max_json_depth
        self.max_values = settings.max_json_values

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        head = scope.get(HEAD)
        if head is None:
            head = scope[HEAD] = RequestHead(scope["headers"])
        verdict = self.admission.admit(head, scope["path"])
        if not isinstance(verdict, Asker):
            await send_reply(send, verdict)
            return
        await self._limited(scope, receive, send)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the body up to the limit before the app sees it (the app would buffer it anyway);
        a chunked body gives no length up front."""
        body = await read_body(receive, self.limit)
        if body is None:
            return  # the client went away
        try:
            if len(body) > self.limit:
                raise TooLarge(f"body exceeds the limit of {self.limit} bytes")
            check_json_shape(body, self.max_depth, self.max_values)
        except GrmError as err:
            await send_reply(send, error_reply(err))
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The request's body, read as ASGI messages up to `limit` bytes and no further (longer
    than `limit`: it is too large, its rest is left unread); None when the client went away."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if size > limit or not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
