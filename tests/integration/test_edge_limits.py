"""What one client may hold of a gateway, tried over raw sockets on a gateway in front of STUB
replicas (keys set): silent, slow and half-sent requests are closed, connections and request
bytes in flight are bounded, repeated singleton headers and upgrade requests are refused.

Each test fails on the edge without these limits: there, a silent connection or a half-sent
request stayed open (still after 150 s), and an upgrade request was never answered.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.support.procs import Proc, gateway_on_stubs

KEY = "edge-test-key"
CHAT = "/v1/chat/completions"
BODY_LIMIT = 200_000
BUDGET = 300_000
ENV = {"GRM_API_KEYS": KEY, "GRM_AUDIT_FRACTION": "0", "GRM_KEEP_ALIVE_S": "2",
       "GRM_HEADER_TIMEOUT_S": "1", "GRM_BODY_TIMEOUT_S": "3", "GRM_MAX_CONNECTIONS": "12",
       "GRM_MAX_IMAGE_BYTES": "100000", "GRM_MAX_BODY_BYTES": str(BODY_LIMIT),
       "GRM_MAX_BYTES_IN_FLIGHT": str(BUDGET)}
# A deadline well past each timeout: the sweep runs every 0.25 s, and the machine may be busy.
SLACK_S = 4.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, stub_pair: list[Proc]) -> Iterator[Proc]:
    with gateway_on_stubs(tmp_path_factory.mktemp("edge"), env=ENV, shared=stub_pair) as pair:
        yield pair[0]


def connect(gw: Proc) -> socket.socket:
    address = urlsplit(gw.url)
    sock = socket.create_connection((address.hostname, address.port), timeout=30)
    return sock


def until_closed(sock: socket.socket, within_s: float) -> tuple[bytes, float]:
    """What the gateway sent until it closed the connection, and after how long; fails if it
    is still open after `within_s`."""
    start = time.monotonic()
    sock.settimeout(within_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pytest.fail(f"still open after {within_s:.0f} s; received {data[:200]!r}")
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    return data, time.monotonic() - start


def request(path: str, body: bytes, *headers: str, length: int | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: gw", "content-type: application/json",
             f"content-length: {len(body) if length is None else length}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chat_body() -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()


AUTH = f"authorization: Bearer {KEY}"


def answer_of(gw: Proc, raw: bytes) -> bytes:
    with connect(gw) as sock:
        sock.sendall(raw)
        sock.settimeout(30)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        while len(rest) < length:
            rest += sock.recv(65536)
        return head + b"\r\n\r\n" + rest


def test_a_connection_that_sends_nothing_is_closed(gateway: Proc) -> None:
    data, after = until_closed(connect(gateway), 2 + SLACK_S)
    assert data == b"" and after >= 1.5


def test_a_connection_idle_after_a_response_is_closed(gateway: Proc) -> None:
    sock = connect(gateway)
    sock.sendall(b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n")
    data, after = until_closed(sock, 2 + SLACK_S)
    assert data.startswith(b"HTTP/1.1 200 OK") and after >= 1.5


@pytest.mark.parametrize("sent", [
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-",  # half a header
    b"GET /health HTTP/1.1\r\nhost: gw\r\n",  # headers, not their end
], ids=["half-a-header", "no-end-of-headers"])
def test_headers_that_do_not_arrive_in_time_get_408(gateway: Proc, sent: bytes) -> None:
    sock = connect(gateway)
    sock.sendall(sent)
    data, after = until_closed(sock, 1 + SLACK_S)
    assert data.startswith(b"HTTP/1.1 408 ") and b"connection: close" in data, data[:300]
    assert after >= 0.75


@pytest.mark.parametrize("path", [CHAT, "/v1/score"])
def test_a_body_that_does_not_arrive_in_time_gets_408(gateway: Proc, path: str) -> None:
    body = chat_body()
    sock = connect(gateway)
    sock.sendall(request(path, body, AUTH)[:-5])
    data, after = until_closed(sock, 3 + SLACK_S)
    assert data.startswith(b"HTTP/1.1 408 ") and after >= 2.5, data[:300]


def test_open_connections_are_bounded(gateway: Proc) -> None:
    # Opened at once: well within the idle timeout, which would close the first ones.
    held = [connect(gateway) for _ in range(13)]
    answers = []
    try:
        for sock in held:
            sock.settimeout(0.5)
            try:
                answers.append(sock.recv(65536))
            except TimeoutError:
                answers.append(b"")
    finally:
        for sock in held:
            sock.close()
    refused = [answer for answer in answers if answer]
    assert refused, "13 connections open where the bound is 12, and none refused"
    assert all(a.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in a for a in refused)
    assert answers[0] == b"", "the first connections are kept"
    time.sleep(0.5)  # the gateway sees the closes
    assert answer_of(gateway, b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n").startswith(
        b"HTTP/1.1 200 OK")


@pytest.mark.parametrize("path", [CHAT, "/v1/score"])
def test_request_bytes_in_flight_are_bounded_before_a_body_is_read(gateway: Proc,
                                                                   path: str) -> None:
    first = connect(gateway)
    first.sendall(request(path, b"{", AUTH, length=BODY_LIMIT))  # reserves BODY_LIMIT, held
    time.sleep(0.3)
    second = connect(gateway)
    second.sendall(request(path, b"", AUTH, length=BUDGET - BODY_LIMIT + 1))  # headers only
    data, _ = until_closed(second, SLACK_S)
    assert data.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in data, data[:300]
    assert b"request bytes in flight" in data
    first.close()
    time.sleep(0.5)  # the reservation goes with the connection
    assert answer_of(gateway, request(path, b"[1]", AUTH)).startswith(b"HTTP/1.1 422 ")


# `request` sends host and content-type once already.
REPEATS = {
    "authorization": ["authorization: Bearer wrong", AUTH],  # a wrong key, then the right one
    "pin": [AUTH, "x-grm-pin-replica: a", "x-grm-pin-replica: b"],
    "content-type": [AUTH, "content-type: text/plain"],
    "host": [AUTH, "host: other"],
}


@pytest.mark.parametrize("path", [CHAT, "/v1/score"])
@pytest.mark.parametrize("repeat", REPEATS)
def test_repeated_singleton_headers_are_refused(gateway: Proc, path: str, repeat: str) -> None:
    answer = answer_of(gateway, request(path, chat_body(), *REPEATS[repeat]))
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert b"sent more than once" in answer


def test_a_repeated_content_length_is_refused(gateway: Proc) -> None:
    body = chat_body()
    raw = request(CHAT, body, AUTH, f"content-length: {len(body)}")
    data, _ = until_closed(_sent(gateway, raw), SLACK_S)
    assert data.startswith(b"HTTP/1.1 400 "), data[:300]


def _sent(gw: Proc, raw: bytes) -> socket.socket:
    sock = connect(gw)
    sock.sendall(raw)
    return sock


@pytest.mark.parametrize("path", [CHAT, "/classify", "/v1/score", "/health"])
def test_an_upgrade_request_is_refused_and_closed(gateway: Proc, path: str) -> None:
    raw = request(path, chat_body(), AUTH, "connection: upgrade", "upgrade: websocket",
                  "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==", "sec-websocket-version: 13")
    data, _ = until_closed(_sent(gateway, raw), SLACK_S)
    assert data.startswith(b"HTTP/1.1 400 ") and b"Upgrade is not supported" in data, data[:300]
