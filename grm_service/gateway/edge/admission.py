"""Admission: the one place that decides, once per request and from its head alone, whether
the request may go on, and who asks.

`Admission.admit` reads the parsed head (`head.py`): a singleton header sent twice is a 400, a
missing or wrong API key a 401 (except on the open paths), a declared body over
`GRM_MAX_BODY_BYTES` a 413. It yields the `Asker` (the key presented, whether it is a valid
one) or the `Reply` that refuses. The verdict is kept on the head, so every edge that holds the
head (the hot path, `Guards` before FastAPI, the routes' dependencies) reads the same one,
whichever asked first. The API key is parsed here and nowhere else.
"""

from __future__ import annotations

import base64
import binascii
import hmac

from grm_service.config import Settings
from grm_service.errors import BadHeader, TooLarge, Unauthorized
from grm_service.gateway.edge.head import Asker, RequestHead
from grm_service.gateway.edge.replies import Reply, error_reply

OPEN_PATHS = frozenset({"/health", "/ready"})
# Open unless GRM_METRICS_AUTH: the gateway's metrics, and the engines' relayed (routes_engines).
METRICS_PATHS = frozenset({"/metrics", "/metrics/targets", "/metrics/engine"})


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


def key_ok(token: bytes | None, keys: list[bytes]) -> bool:
    """`token` is one of `keys`."""
    if token is None:
        return False
    # Compare against every key, always: the time taken must not tell which one matched.
    matches = [hmac.compare_digest(token, key) for key in keys]
    return any(matches)


class Admission:
    def __init__(self, settings: Settings) -> None:
        self.limit = settings.max_body_bytes
        self.keys = [key.encode() for key in settings.all_api_keys()]
        self.open_paths = OPEN_PATHS if settings.metrics_auth else OPEN_PATHS | METRICS_PATHS

    def admit(self, head: RequestHead, path: str) -> Asker | Reply:
        """The asker, or the refusal; decided on the head's first admission, read after."""
        verdict = head.admitted
        if verdict is None:
            verdict = head.admitted = self._decide(head, path)
        return verdict

    def _decide(self, head: RequestHead, path: str) -> Asker | Reply:
        if head.repeated:
            return error_reply(BadHeader(f"header {head.repeated!r} sent more than once: "
                                         "send it once"))
        token = presented_key(head.authorization)
        authorized = not self.keys or key_ok(token, self.keys)
        if not authorized and path not in self.open_paths:
            return error_reply(Unauthorized("missing or invalid API key: send 'Authorization: "
                                            "Bearer <key>' (or the key as the URL's password)"),
                               {"www-authenticate": "Bearer"})
        if head.content_length > self.limit:
            return error_reply(TooLarge(f"body is {head.content_length} bytes; the limit is "
                                        f"{self.limit}"))
        return Asker(token, authorized)
