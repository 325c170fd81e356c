"""The floor of the gateway's per-request work in Python, as a contender of bench_gateway.py.

A proxy that does what an answer of grm-service needs for its bits, and nothing more: the body
parsed, the seed and max_tokens set where absent, the canonical JSON (sorted keys, compact,
UTF-8), crc32 rendezvous of that JSON over the replicas, the body forwarded on a kept-alive
connection, the answer parsed, blake3 digests of the request and of what the model produced,
a fingerprint appended to the answer and sent in headers, one write. On uvloop, with httptools
parsing both sides and nothing between them and the sockets.

Left out, on purpose: the body rules and the image check, the edge's limits, metrics, the
ledger, failover, breakers, per-replica gates, the audit, the identity's admission. What they
and the layers the gateway is built of (uvicorn's protocol, FastAPI beside the hot path) cost is
grm-service's CPU per request minus this one's, in the same run.

    python benchmarks/harness/lean_proxy.py --port 0 --backend-url URL [--backend-url URL ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import zlib
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import blake3
import httptools
import uvloop

SEED = 0
MAX_TOKENS = 256
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class Upstream(asyncio.Protocol):
    """One kept-alive connection to a replica, one request at a time (byte_floor.py's too)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, self.body = b"".join(self.body), []
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self.parser.get_status_code(), body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True  # a replica closes idle connections (uvicorn: after 5 s)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("the replica closed the connection"))


class _Replica:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.name = url
        self.tag = url.encode()
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {parts.netloc}\r\n"
                     "content-type: application/json\r\ncontent-length: ")
        self.idle: list[Upstream] = []

    async def post(self, data: bytes) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        while self.idle and self.idle[-1].closed:
            self.idle.pop()
        if self.idle:
            conn = self.idle.pop()
        else:
            _, conn = await loop.create_connection(Upstream, self.host, self.port)
        conn.waiter = loop.create_future()
        assert conn.transport is not None
        conn.transport.write(f"{self.head}{len(data)}\r\n\r\n".encode() + data)
        answer = await conn.waiter
        self.idle.append(conn)
        return answer


def _produced(payload: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"index": c.get("index"), "content": (c.get("message") or {}).get("content"),
             "logprobs": c.get("logprobs")} for c in payload.get("choices") or []]


class Proxy:
    def __init__(self, urls: list[str]) -> None:
        self.replicas = [_Replica(url) for url in urls]
        # The loop keeps only weak references to tasks: a request's task is held until it ends.
        self.tasks: set[asyncio.Task[None]] = set()

    async def answer(self, raw: bytes) -> tuple[int, bytes, str]:
        body = json.loads(raw)
        body.setdefault("seed", SEED)
        body.setdefault("max_tokens", MAX_TOKENS)
        canonical = _CANONICAL.encode(body).encode()
        key = zlib.crc32(canonical)
        replica = max(self.replicas, key=lambda r: zlib.crc32(r.tag, key))
        status, answer = await replica.post(canonical)
        request_digest = blake3.blake3(canonical).hexdigest(16)
        response_digest = blake3.blake3(
            _CANONICAL.encode(_produced(json.loads(answer))).encode()).hexdigest(16)
        fields = (f'"seed":{body["seed"]},"replica":"{replica.name}",'
                  f'"request_digest":"{request_digest}","response_digest":"{response_digest}"')
        out = answer[:-1] + f',"grm_fingerprint":{{{fields}}}}}'.encode()
        headers = (f"x-grm-seed: {body['seed']}\r\nx-grm-replica: {replica.name}\r\n"
                   f"x-grm-request-digest: {request_digest}\r\n"
                   f"x-grm-response-digest: {response_digest}\r\n")
        return status, out, headers


class _Client(asyncio.Protocol):
    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        raw, self.body = b"".join(self.body), []
        keep = self.parser.should_keep_alive()
        if self.parser.get_method() == b"GET":  # /health
            self._write(200, b"{}", "", keep)
            return
        task = asyncio.get_running_loop().create_task(self._serve(raw, keep))
        self.proxy.tasks.add(task)
        task.add_done_callback(self.proxy.tasks.discard)

    async def _serve(self, raw: bytes, keep: bool) -> None:
        try:
            status, out, headers = await self.proxy.answer(raw)
        except (ValueError, ConnectionError, OSError) as err:
            status, out, headers = 502, json.dumps({"error": str(err)}).encode(), ""
        self._write(status, out, headers, keep)

    def _write(self, status: int, out: bytes, headers: str, keep: bool) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return
        head = (f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\n"
                f"content-type: application/json\r\ncontent-length: {len(out)}\r\n{headers}\r\n")
        self.transport.write(head.encode() + out)
        if not keep:
            self.transport.close()


async def serve(port: int, factory: Callable[[], asyncio.BaseProtocol]) -> None:
    """Serve `factory`'s protocols on 127.0.0.1:`port` (0: a free one, printed as `PORT n`)
    until killed (byte_floor.py's too)."""
    # Bound with IPPROTO_TCP, as stub_openai.listening says why (not imported: the floor loads
    # nothing of the product): TCP_NODELAY on accepted sockets.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = await asyncio.get_running_loop().create_server(factory, sock=sock, backlog=1024)
    sys.stdout.write(f"PORT {sock.getsockname()[1]}\n")
    sys.stdout.flush()
    await server.serve_forever()


def arguments(doc: str | None) -> argparse.Namespace:
    """`--port` and the replicas' `--backend-url`s (byte_floor.py's too)."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--backend-url", action="append", required=True)
    return parser.parse_args()


def main() -> None:
    args = arguments(__doc__)
    proxy = Proxy(args.backend_url)
    uvloop.run(serve(args.port, lambda: _Client(proxy)))


if __name__ == "__main__":
    main()
