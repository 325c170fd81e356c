"""The protocols a connection is handed to for a while, outside the HTTP parser
(`protocol.py`): `BodyReader` reads the rest of a large hot body straight into one buffer, and
`Linger` drops what a refused client still sends (a lingering close, `limits.py`)."""

from __future__ import annotations

import asyncio
import ctypes
from typing import Any, Protocol

from grm_service.gateway.edge.limits import EdgeLimits


class Reading(Protocol):
    """The HTTP protocol a `BodyReader` hands the connection back to."""

    def body_read(self, exchange: Any) -> None: ...

    def eof_received(self) -> bool | None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...

    def pause_writing(self) -> None: ...

    def resume_writing(self) -> None: ...


class Lingering(Protocol):
    """The HTTP protocol whose connection lingers: its deadline is swept (`EdgeLimits`)."""

    limits: EdgeLimits
    deadline: float
    transport: asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None: ...


class Linger(asyncio.Protocol):
    """The connection's protocol while it lingers: what comes in is dropped unparsed, and the
    owner's deadline moves on with each read, up to `end`; past `unread` bytes it closes."""

    def __init__(self, owner: Lingering, unread: int, end: float) -> None:
        self.owner, self.unread, self.end = owner, unread, end
        owner.deadline = min(owner.limits.now + owner.limits.linger_s, end)

    def data_received(self, data: bytes) -> None:
        owner = self.owner
        self.unread -= len(data)
        if self.unread < 0:
            owner.transport.close()
        else:
            owner.deadline = min(owner.limits.now + owner.limits.linger_s, self.end)

    def eof_received(self) -> None:
        pass  # the client is done: the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.connection_lost(exc)


class BodyReader(asyncio.BufferedProtocol):
    """The connection's protocol while the rest of a hot body is read into `buffer`; it hands
    the connection back once the body is whole, and reads nothing past it (each read is given
    the body's missing bytes only, so a pipelined request stays in the socket)."""

    def __init__(self, owner: Reading, exchange: Any, buffer: bytearray,
                 filled: int) -> None:
        self.owner, self.exchange = owner, exchange
        self.view, self.filled = memoryview(buffer), filled

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.filled:]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.filled == len(self.view):
            self.owner.body_read(self.exchange)

    def eof_received(self) -> None:
        self.owner.eof_received()  # uvicorn's: nothing, so the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.owner.pause_writing()

    def resume_writing(self) -> None:
        self.owner.resume_writing()


# CPython's own constructor, given no bytes to copy, leaves the new buffer's contents as the
# allocator gives them: `bytearray(n)` would zero megabytes that the reads overwrite at once.
_new_bytearray = ctypes.pythonapi.PyByteArray_FromStringAndSize
_new_bytearray.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_new_bytearray.restype = ctypes.py_object


def _unfilled(size: int) -> bytearray:
    """A bytearray of `size` bytes, not zeroed: every byte is written before it is read."""
    buffer = _new_bytearray(None, size)
    assert isinstance(buffer, bytearray)
    return buffer


# The parse makes a `str` of an image's data URL (`longstrings.loads`). CPython's ASCII decoder
# copies word by word, checking as it copies, only where the text starts on a word boundary;
# elsewhere it checks the whole text, then copies it (the parse's lift of a 2.7 MB page scan:
# ~290 against ~210 us, benchmarks/RESULTS.md). The body's buffer is placed to give the first
# data URL that start.
_WORD = 8
_DATA_URL = b'"data:'


def body_buffer(size: int, first: bytes | bytearray) -> bytearray:
    """An unfilled buffer for a body of `size` bytes whose first read is `first`, placed so that
    the text of the first data URL in `first` (if any) starts on a word boundary."""
    at = first.find(_DATA_URL)
    if at < 0:
        return _unfilled(size)
    buffer = _unfilled(size + _WORD)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    # O(1): CPython drops a bytearray's first bytes by moving its start, not its contents.
    del buffer[:(-(base + at + 1)) % _WORD]
    del buffer[size:]
    return buffer
