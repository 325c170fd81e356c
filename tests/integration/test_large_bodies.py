"""Large chat bodies through a real gateway over a real socket, sent in pieces, as an image
request arrives: past the read that ends its headers, the gateway's transport reads the rest
straight into one buffer of the body's size (`edge/protocol.py`, `_BodyReader`). The replica
must get every byte as sent, request after request (the buffer is not zeroed, so a byte left
unread would show an earlier body), and a request pipelined behind a large body must be read
and answered too. A body larger than the request bytes the gateway may hold is refused before
it is read, and the client, still sending it, must read that refusal.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from grm_service.canonical import canonical_json
from grm_service.fingerprint import digest
from tests.support.procs import Proc, gateway_on_stubs, received

SIZE = 3 << 20  # base64 characters of each body's long string: a page scan's order
BUDGET = 6 << 20  # request bytes in flight (and the largest body): two of SIZE fit
ENV = {"GRM_AUDIT_FRACTION": "0", "GRM_MAX_BYTES_IN_FLIGHT": str(BUDGET),
       "GRM_MAX_BODY_BYTES": str(BUDGET), "GRM_MAX_IMAGE_BYTES": str(BUDGET // 2)}


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, stub_pair: list[Proc]
) -> Iterator[tuple[Proc, list[Proc]]]:
    tmp = tmp_path_factory.mktemp("large-bodies")
    with gateway_on_stubs(tmp, env=ENV, shared=stub_pair) as pair:
        yield pair


def chat(content: str) -> dict[str, Any]:
    """A body the gateway leaves as it is (model, seed and max_tokens given)."""
    return {"model": "rm", "seed": 1, "max_tokens": 4,
            "messages": [{"role": "user", "content": content}]}


def request(body: dict[str, Any]) -> bytes:
    raw = json.dumps(body).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json"
            b"\r\ncontent-length: %d\r\n\r\n" % len(raw)) + raw


def text(seed: int) -> str:
    return base64.b64encode(random.Random(seed).randbytes(SIZE // 4 * 3)).decode()


class Connection:
    """One keep-alive connection written in pieces, its answers read in order."""

    def __init__(self, url: str) -> None:
        host, port = url.rsplit("/", 1)[1].split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.file = self.sock.makefile("rb")

    def send(self, data: bytes, pieces: int) -> None:
        step = -(-len(data) // pieces)
        for start in range(0, len(data), step):
            self.sock.sendall(data[start:start + step])
            time.sleep(0.01)  # separate reads on the gateway's side

    def answer(self) -> tuple[int, dict[str, str]]:
        """The next answer's status and headers (its body read and dropped)."""
        status = int(self.file.readline().split()[1])
        headers = {}
        while (line := self.file.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        self.file.read(int(headers["content-length"]))
        return status, headers

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def sent_contents(stubs: list[Proc]) -> list[str]:
    bodies = (r["body"] for r in received(stubs))
    return [b["messages"][0]["content"] for b in bodies if isinstance(b, dict)]


def test_large_bodies_in_pieces_reach_the_replica_byte_for_byte(
    service: tuple[Proc, list[Proc]],
) -> None:
    gateway, stubs = service
    received(stubs, clear=True)
    bodies = [chat(text(seed)) for seed in range(3)]
    conn = Connection(gateway.url)
    try:
        for body in bodies:
            conn.send(request(body), pieces=7)
            status, headers = conn.answer()
            assert status == 200
            # The request digest is over the canonical JSON the gateway built from its read.
            assert headers["x-grm-request-digest"] == digest(canonical_json(body))
    finally:
        conn.close()
    assert sorted(sent_contents(stubs)) == sorted(b["messages"][0]["content"] for b in bodies)


def test_a_request_pipelined_behind_a_large_body_is_answered(
    service: tuple[Proc, list[Proc]],
) -> None:
    gateway, stubs = service
    received(stubs, clear=True)
    large, small = chat(text(7)), chat("the next request")
    conn = Connection(gateway.url)
    try:
        conn.send(request(large) + request(small), pieces=5)
        first, second = conn.answer(), conn.answer()
    finally:
        conn.close()
    assert (first[0], second[0]) == (200, 200)
    assert first[1]["x-grm-request-digest"] == digest(canonical_json(large))
    assert second[1]["x-grm-request-digest"] == digest(canonical_json(small))
    assert sorted(sent_contents(stubs)) == sorted([large["messages"][0]["content"],
                                                   "the next request"])


def test_bodies_refused_for_want_of_room_get_their_503_while_still_sending(
    service: tuple[Proc, list[Proc]],
) -> None:
    """40 clients at once, each sending an 8 MiB body past the byte budget: the gateway
    answers 503 from the headers and drops the rest of the body as it comes (a lingering
    close). Closed at once, the socket reset the clients still sending, which lost the answer
    (httpx `ReadError`/`WriteError`: 25 of 40 on a loaded machine)."""
    gateway, stubs = service
    received(stubs, clear=True)
    body = json.dumps(chat("x" * (8 << 20))).encode()

    async def post(client: httpx.AsyncClient) -> httpx.Response | BaseException:
        try:
            return await client.post("/v1/chat/completions", content=body,
                                     headers={"content-type": "application/json"})
        except httpx.TransportError as err:
            return err

    async def burst() -> list[httpx.Response | BaseException]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
            return await asyncio.gather(*(post(client) for _ in range(40)))

    answers = asyncio.run(burst())
    failed = [repr(a) for a in answers if not isinstance(a, httpx.Response)]
    assert not failed, f"{len(failed)} of 40 lost their answer: {failed[:3]}"
    for answer in answers:
        assert isinstance(answer, httpx.Response)
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
        assert "GRM_MAX_BYTES_IN_FLIGHT" in answer.json()["error"]["message"]
    assert received(stubs) == []
    # The gateway still serves, its budget whole.
    small = httpx.post(gateway.url + "/v1/chat/completions", json=chat("after"), timeout=30)
    assert small.status_code == 200
