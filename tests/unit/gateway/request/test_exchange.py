"""One attempt on one replica, against a real HTTP peer on 127.0.0.1: what each answer and each
transport failure becomes (a payload, `Retryable` for `proxy` to fail over, or an error every
replica would give), and that the replica's slot and in-flight gauge are given back each time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from grm_service.config import Settings
from grm_service.errors import ReplicaRejected, ResponseTooLarge
from grm_service.gateway.request import exchange
from grm_service.gateway.request.context import ForwardContext
from grm_service.gateway.request.upstream import Upstream
from grm_service.metrics import Metrics
from grm_service.replicas.identity import ServiceIdentity
from grm_service.replicas.pool import Replica, ReplicaPool, ReplicaState
from tests.support.procs import free_port

PATH = "/v1/chat/completions"
# The body in pieces, as `canonical_parts` hands it over: sent joined, never re-encoded.
RAW: exchange.Body = [b'{"messages":', memoryview(b'[{"role":"user","content":"hi"}]'), b"}"]


def http(status: int, body: bytes, media: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {status} X\r\nContent-Type: {media}\r\nContent-Length: {len(body)}\r\n"
            "\r\n").encode() + body


@dataclass
class Peer:
    """A replica that reads each request whole and writes `reply` as is: None holds the
    request unanswered, b"" closes the connection without a byte."""

    reply: bytes | None
    url: str = ""
    received: list[tuple[bytes, bytes]] = field(default_factory=list)  # (request line, body)
    handlers: list[asyncio.Task[None]] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.append(task)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            self.received.append((head.split(b"\r\n")[0], await reader.readexactly(length)))
            if self.reply:
                writer.write(self.reply)
            if self.reply is None or self.reply:
                await reader.read()  # until the gateway closes (or aborts) the connection
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@contextlib.asynccontextmanager
async def peer(reply: bytes | None) -> AsyncIterator[Peer]:
    found = Peer(reply)
    server = await asyncio.start_server(found.serve, "127.0.0.1", 0)
    found.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        try:
            yield found
        finally:
            # Each connection ends once the gateway's side is closed: none outlives the test.
            async with asyncio.timeout(5):
                await asyncio.gather(*found.handlers)


@contextlib.asynccontextmanager
async def one_replica(url: str, timeout_s: float = 5.0,
                      max_response_bytes: int = 1 << 20) -> AsyncIterator[tuple[ForwardContext,
                                                                                  Replica]]:
    replica = Replica("r0", url, state=ReplicaState.READY)
    settings = Settings(model="/models/m")
    fc = ForwardContext(settings=settings, pool=ReplicaPool([replica]),
                        client=Upstream(timeout_s, max_response_bytes=max_response_bytes),
                        metrics=Metrics(), identity=ServiceIdentity(settings))
    try:
        yield fc, replica
    finally:
        await fc.client.close()
        # Whatever the attempt's outcome, its slot and its in-flight count are given back: the
        # replica is free even for a request that must run alone.
        assert replica.gate.inflight == 0 and replica.gate.try_acquire(True)
        assert fc.metrics.registry.get_sample_value(
            "grm_requests_in_flight", {"replica": "r0"}) == 0


async def attempt_on(reply: bytes | None, alone: bool = False, timeout_s: float = 5.0,
                     max_response_bytes: int = 1 << 20) -> tuple[dict[str, object], bytes]:
    async with peer(reply) as replica_peer, one_replica(
            replica_peer.url, timeout_s, max_response_bytes) as (fc, replica):
        answer = await exchange.attempt(fc, replica, PATH, RAW, alone)
        assert replica_peer.received == [(f"POST {PATH} HTTP/1.1".encode(), b"".join(RAW))]
        return answer


@pytest.mark.parametrize("alone", [False, True])
async def test_a_strict_json_answer_comes_back_with_its_own_bytes(alone: bool) -> None:
    body = b'{"id":"c1","choices":[{"message":{"content":"ok"}}]}'
    payload, raw = await attempt_on(http(200, body), alone)
    assert payload == json.loads(body)
    assert raw == body  # forwarded as is: the gateway need not encode it again


async def test_an_answer_that_is_not_strict_json_comes_back_without_bytes() -> None:
    """NaN parses (as `json.loads` does) but is no JSON a client may be sent as is."""
    payload, raw = await attempt_on(http(200, b'{"score": NaN}'))
    assert math.isnan(payload["score"])  # type: ignore[arg-type]
    assert raw == b""


@pytest.mark.parametrize(("reply", "reason", "said"), [
    (http(500, b'{"error": {"message": "stub failure"}}'), "status", "HTTP 500"),
    (http(503, b"overloaded", "text/plain"), "status", "HTTP 503"),
    (http(200, b"<html><body>It works!</body></html>", "text/html"), "decode",
     "response is not JSON"),
    (http(200, b'{"object": "list", "data": ['), "decode", "response is not JSON"),
    (http(200, b"[1, 2]"), "decode", "response is not a JSON object"),
])
async def test_an_answer_another_replica_may_not_give_is_retryable(
        reply: bytes, reason: str, said: str) -> None:
    with pytest.raises(exchange.Retryable) as failed:
        await attempt_on(reply)
    assert (failed.value.reason, str(failed.value)) == (reason, f"r0: {said}")
    assert failed.value.detail == said


@pytest.mark.parametrize(("status", "said"), [
    (429, "HTTP 429 (too many requests)"),
    (408, "HTTP 408 (timed out reading the request)"),
    (401, "HTTP 401 (refused the gateway's credentials: GRM_REPLICA_API_KEY)"),
    (403, "HTTP 403 (refused the gateway's credentials: GRM_REPLICA_API_KEY)"),
    (407, "HTTP 407 (its proxy wants credentials)"),
])
async def test_a_4xx_about_the_replicas_door_fails_over_instead_of_reaching_the_client(
        status: int, said: str) -> None:
    """An ingress's 429 or a replica's --api-key 401 is not the client's to fix: passed on, it
    would say "slow down" or "your key is wrong" to a client whose body another replica takes."""
    body = b'<html><body>nginx: slow down</body></html>'
    with pytest.raises(exchange.Retryable) as failed:
        await attempt_on(http(status, body, "text/html"))
    assert (failed.value.reason, str(failed.value)) == ("status", f"r0: {said}")
    assert failed.value.detail == f"HTTP {status}: " + body.decode()


@pytest.mark.parametrize(("status", "body", "message"), [
    (400, b'{"error": {"message": "max_tokens is too large", "type": "BadRequestError"}}',
     "engine: max_tokens is too large"),
    (400, b'{"message": "bad image", "type": "invalid_request_error"}', "engine: bad image"),
    # An empty `error.message` says nothing: the top-level message does.
    (400, b'{"error": {"message": ""}, "message": "prompt too long"}',
     "engine: prompt too long"),
    (422, b'{"detail": [{"loc": ["body", "messages"]}]}',
     'engine rejected the request: {"detail": [{"loc": ["body", "messages"]}]}'),
    (400, b'{"error": "unsupported"}', 'engine rejected the request: {"error": "unsupported"}'),
    (400, b'["a", 1]', 'engine rejected the request: ["a", 1]'),
    (404, b"Not Found", "engine: Not Found"),  # a plain-text 4xx: a route the engine lacks
])
async def test_a_4xx_is_the_engines_refusal_with_its_message(
        status: int, body: bytes, message: str) -> None:
    with pytest.raises(ReplicaRejected) as refused:
        await attempt_on(http(status, body))  # read by its bytes, whatever its Content-Type
    assert refused.value.message == message
    assert refused.value.http_status == status


async def test_a_long_or_undecodable_4xx_is_cut_to_500_characters() -> None:
    with pytest.raises(ReplicaRejected) as plain:
        await attempt_on(http(413, b"\xff" + b"x" * 2000, "text/plain"))
    assert plain.value.message == "engine: \ufffd" + "x" * 499
    with pytest.raises(ReplicaRejected) as unknown:
        await attempt_on(http(400, json.dumps({"detail": "y" * 2000}).encode()))
    assert unknown.value.message == ("engine rejected the request: "
                                     + json.dumps({"detail": "y" * 2000})[:500])


async def test_no_answer_in_time_is_a_retryable_timeout() -> None:
    with pytest.raises(exchange.Retryable) as failed:
        await attempt_on(None, timeout_s=0.2)
    assert (failed.value.reason, str(failed.value)) == ("timeout", "r0: timed out")
    assert isinstance(failed.value.__cause__, TimeoutError)


@pytest.mark.parametrize(("reply", "error"), [
    (b"", "ConnectionResetError"),  # closed before a byte of the answer
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "UpstreamProtocolError"),  # not HTTP
])
async def test_a_broken_connection_is_retryable_and_its_detail_says_how(
        reply: bytes, error: str) -> None:
    with pytest.raises(exchange.Retryable) as failed:
        await attempt_on(reply)
    assert (failed.value.reason, str(failed.value)) == ("connection", "r0: connection failed")
    assert failed.value.detail.startswith(f"{error} to http://127.0.0.1:")


async def test_a_refused_connection_is_retryable_and_the_address_stays_in_the_log() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with one_replica(url) as (fc, replica):
        with pytest.raises(exchange.Retryable) as failed:
            await exchange.attempt(fc, replica, PATH, RAW, alone=True)
    assert str(failed.value) == "r0: connection failed"  # what a client may see: no address
    assert failed.value.detail.startswith(f"ConnectionRefusedError to {url}: ")


async def test_an_answer_over_the_cap_is_not_retried_and_names_the_replica() -> None:
    """Every replica would answer as large: `ResponseTooLarge`, never `Retryable`."""
    with pytest.raises(ResponseTooLarge) as failed:
        await attempt_on(http(200, b'{"text": "' + b"x" * 100 + b'"}'), max_response_bytes=64)
    assert failed.value.message.startswith("r0: the answer is over 64 bytes")
    assert failed.value.__cause__ is None and failed.value.__suppress_context__
