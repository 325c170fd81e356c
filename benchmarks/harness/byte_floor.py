"""The byte floor of a large image request: what a proxy spends on a body's bytes alone.

Goal 2 of the image-request work asks that a 2 MB page scan cost the gateway about what hashing
and copying its bytes costs. This server does that byte work and nothing else, over the same
sockets as the gateway, so `bench_images.py` can set its CPU per request beside the gateway's:

- the body read straight into one buffer of its size (the kernel's copy; no parser copies);
- crc32 of the body (the route digest) and its blake3 digest (the request digest), with the
  libraries the gateway uses (ISA-L's crc32, blake3);
- the body's longest JSON string base64-decoded after its data-URL prefix (the image check's
  decode; no framing or pixel checks);
- the body forwarded unchanged to one replica in one write, the answer read and sent back.

No JSON parse, no canonical form, no checks, no fingerprint: a lower bound for any proxy that
routes and digests the body it forwards, not a design.

    python benchmarks/harness/byte_floor.py --port 0 --backend-url URL
"""

from __future__ import annotations

import asyncio
import ctypes
from urllib.parse import urlsplit

import blake3
import pybase64
import uvloop
from isal import isal_zlib
from lean_proxy import Upstream, arguments, serve

_HEAD_BYTES = 1 << 16
# A buffer the reads fill at once: `bytearray(n)` would zero it first (as the gateway avoids).
_new_bytearray = ctypes.pythonapi.PyByteArray_FromStringAndSize
_new_bytearray.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_new_bytearray.restype = ctypes.py_object


def byte_work(body: bytearray) -> None:
    """The route digest, the digest and the image's decode: what the floor spends per body."""
    isal_zlib.crc32(body)
    blake3.blake3(body).digest()
    end = body.rfind(b'"')
    start = body.rfind(b'"', 0, end) + 1
    comma = body.find(b",", start, end)
    if comma != -1:
        pybase64.b64decode(memoryview(body)[comma + 1:end], validate=True)


class _Client(asyncio.BufferedProtocol):
    """Reads a request's head into a small buffer, then its body straight into its own."""

    def __init__(self, replica: tuple[str, int], head: bytes) -> None:
        self.replica, self.head = replica, head
        self.upstream: Upstream | None = None
        self.transport: asyncio.Transport | None = None
        self.small = bytearray(_HEAD_BYTES)
        self.filled = 0
        self.body: bytearray | None = None
        self.task: asyncio.Task[None] | None = None  # the loop keeps only a weak reference

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.body is None:
            return memoryview(self.small)[self.filled:]
        return memoryview(self.body)[self.filled:]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.body is None:
            self._head_read()
        elif self.filled == len(self.body):
            self._whole()

    def _head_read(self) -> None:
        end = self.small.find(b"\r\n\r\n", 0, self.filled)
        if end == -1:
            return
        head = bytes(self.small[:end]).lower()
        if head.startswith(b"get"):  # /health
            self.filled = 0
            self._reply(b"{}")
            return
        length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        got = self.filled - end - 4
        body = _new_bytearray(None, length)
        assert isinstance(body, bytearray)
        body[:got] = self.small[end + 4:self.filled]
        self.body, self.filled = body, got
        if got == length:
            self._whole()

    def _whole(self) -> None:
        body, self.body, self.filled = self.body, None, 0
        assert body is not None
        self.task = asyncio.get_running_loop().create_task(self._serve(body))

    async def _serve(self, body: bytearray) -> None:
        byte_work(body)
        if self.upstream is None:
            _, self.upstream = await asyncio.get_running_loop().create_connection(
                Upstream, *self.replica)
        upstream = self.upstream
        assert upstream.transport is not None
        upstream.waiter = asyncio.get_running_loop().create_future()
        upstream.transport.writelines((self.head, str(len(body)).encode(), b"\r\n\r\n", body))
        self._reply((await upstream.waiter)[1])

    def _reply(self, answer: bytes) -> None:
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(answer), answer))


def main() -> None:
    args = arguments(__doc__)
    parts = urlsplit(args.backend_url[0])
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {parts.netloc}\r\n"
            "content-type: application/json\r\ncontent-length: ").encode()
    replica = (parts.hostname or "127.0.0.1", parts.port or 80)
    uvloop.run(serve(args.port, lambda: _Client(replica, head)))


if __name__ == "__main__":
    main()
