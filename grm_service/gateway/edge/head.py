"""The few request headers the edge reads, found in one pass over the parsed header list, and
the headers a request may carry only once.

A second `Authorization` or `x-grm-pin-replica` is ambiguous (which one wins differs between
libraries: starlette's `Headers.get` takes the first, a dict of the list the last), and a second
`Content-Length`, `Content-Type` or `Host` is a request-smuggling shape: each is refused with a
400 on every path (`Guards`), never resolved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from grm_service.headers import PIN_HEADER, RUN_HEADER, STEP_HEADER

if TYPE_CHECKING:
    from grm_service.gateway.edge.replies import Reply

Headers = list[tuple[bytes, bytes]]

_PIN = PIN_HEADER.encode()
_RUN, _STEP = RUN_HEADER.encode(), STEP_HEADER.encode()
SINGLETONS = (b"authorization", b"content-length", b"content-type", b"host", _PIN)


class Asker(NamedTuple):
    """Who asks: the key presented (None: no usable credentials), and whether it is one of the
    service's keys (always True where the service has none). An open path admits an asker
    without a valid key; it shows such an asker less (`/ready`). A tuple: one is built per
    request, and a frozen dataclass's `__init__` costs several times as much."""

    key: bytes | None
    authorized: bool


class RequestHead:
    """Authorization, Content-Length, whether the body is to be read as JSON, the replica pin,
    the ledger's run and step tags, whether the client waits for `100 Continue`, the first
    singleton header found twice (`repeated`, empty when none), and admission's verdict on
    them (`admission.py`; None until it is asked)."""

    __slots__ = ("admitted", "authorization", "content_length", "expect_continue", "json", "pin",
                 "repeated", "run", "step")

    def __init__(self, headers: Headers) -> None:
        # A dict of the list, in C, and a lookup per name: a Python loop over the headers cost
        # ~8 lines of bytecode each. A repeated name keeps its last value, as the loop did.
        table = dict(headers)
        length = table.get(b"content-length")
        ctype = table.get(b"content-type")
        pin, run, step = table.get(_PIN), table.get(_RUN), table.get(_STEP)
        expect = table.get(b"expect")
        self.authorization = table.get(b"authorization") or b""
        self.content_length = int(length) if length is not None and length.isdigit() else -1
        self.json = ctype is None or _json_type(ctype)
        self.pin = pin.decode("latin-1") if pin is not None else None
        self.run = run.decode("latin-1") if run is not None else None
        self.step = step.decode("latin-1") if step is not None else None
        if len(table) == len(headers):
            self.repeated = ""
            self.expect_continue = expect is not None and expect.lower() == b"100-continue"
        else:  # a name given twice: which one, and any `Expect: 100-continue` (uvicorn's way)
            self.repeated = _repeated(headers)
            self.expect_continue = _expects(headers)
        self.admitted: Asker | Reply | None = None


def _json_type(ctype: bytes) -> bool:
    """The body is JSON by its media type: `application/json` or `application/<x>+json`, as
    FastAPI reads a body (one without a content type is read as JSON too)."""
    kind = ctype.split(b";", 1)[0].strip().lower()
    return kind == b"application/json" or (kind.startswith(b"application/")
                                            and kind.endswith(b"+json"))


def _repeated(headers: Headers) -> str:
    """The first singleton header found twice; empty where only other names repeat."""
    names = [key for key, _ in headers if key in SINGLETONS]
    return next((name for name in names if names.count(name) > 1), b"").decode("latin-1")


def _expects(headers: Headers) -> bool:
    return any(key == b"expect" and value.lower() == b"100-continue" for key, value in headers)
