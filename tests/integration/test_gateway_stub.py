"""The gateway itself, in front of STUB OpenAI backends (no model runs here)."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.procs import Proc, gateway_on_stubs, running_gateway, start_stub

MSGS = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stub")


@pytest.fixture(scope="module")
def gateway_and_stubs(tmp: Path, stub_pair: list[Proc]) -> Iterator[tuple[Proc, list[Proc]]]:
    with gateway_on_stubs(tmp, "--seed", "11", shared=stub_pair) as pair:
        yield pair


@pytest.fixture(scope="module")
def stubs(gateway_and_stubs: tuple[Proc, list[Proc]]) -> list[Proc]:
    return gateway_and_stubs[1]


@pytest.fixture(scope="module")
def gateway(gateway_and_stubs: tuple[Proc, list[Proc]]) -> Proc:
    return gateway_and_stubs[0]


def chat(gateway: Proc, **body: object) -> httpx.Response:
    return httpx.post(gateway.url + "/v1/chat/completions",
                      json={"messages": MSGS, **body}, timeout=30)


def test_fingerprint_in_body_and_headers(gateway: Proc) -> None:
    r = chat(gateway)
    assert r.status_code == 200, r.text
    body = r.json()
    fp = body["grm_fingerprint"]
    assert fp["fingerprint_id"] == r.headers["x-grm-fingerprint"]
    # OpenAI's field names the backend configuration alone; the seeded id is grm's.
    assert body["system_fingerprint"].startswith("grm-unverified-sys-")
    assert fp["seed"] == 11 and r.headers["x-grm-seed"] == "11"
    assert fp["replica"] == r.headers["x-grm-replica"] in ("r0", "r1")
    assert fp["request_digest"] == r.headers["x-grm-request-digest"]
    assert fp["response_digest"] == r.headers["x-grm-response-digest"]
    service = httpx.get(gateway.url + "/v1/fingerprint").json()
    assert service["fingerprint_id"] == fp["fingerprint_id"]
    # STUB backends serve no /grm/identity: a plain server, served unverified, nothing made up.
    assert service["identity"] == fp["identity"] == "unverified"
    assert service["model_hash"] is None and "model_hash" in service["unknown"]


def test_seed_injected_and_client_seed_kept(gateway: Proc) -> None:
    injected = chat(gateway).json()
    explicit = chat(gateway, seed=11, max_tokens=4096, model="rm").json()
    other = chat(gateway, seed=12).json()
    # The stub's text is a hash of the bytes it received: same bytes <=> same text.
    content = injected["choices"][0]["message"]["content"]
    assert explicit["choices"][0]["message"]["content"] == content
    assert other["choices"][0]["message"]["content"] != content
    assert other["grm_fingerprint"]["seed"] == 12
    ids = {answer["grm_fingerprint"]["fingerprint_id"] for answer in (injected, other)}
    assert len(ids) == 2
    # Another seed is not another backend: the two stubs run one configuration.
    assert other["system_fingerprint"] == injected["system_fingerprint"]


def test_same_request_same_replica(gateway: Proc) -> None:
    for i in range(10):
        seen = {chat(gateway, seed=i).headers["x-grm-replica"] for _ in range(3)}
        assert len(seen) == 1
    spread = {chat(gateway, seed=i).headers["x-grm-replica"] for i in range(40)}
    assert spread == {"r0", "r1"}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"stream": True}, 400, "stream=false"),
        ({"model": "nope"}, 404, "'rm'"),
        ({"seed": -1}, 400, "seed"),
        ({"max_tokens": 0}, 422, "max_tokens"),
        ({"messages": []}, 422, "messages"),
        ({"top_p": 2}, 422, "top_p"),
    ],
)
def test_bad_requests_get_4xx_with_reason(
    gateway: Proc, body: dict[str, object], status: int, message: str
) -> None:
    r = chat(gateway, **body)
    assert r.status_code == status, r.text
    assert message in r.text


def test_models_ready_metrics(gateway: Proc) -> None:
    models = httpx.get(gateway.url + "/v1/models").json()
    assert models["data"][0]["id"] == "rm"
    ready = httpx.get(gateway.url + "/ready").json()
    assert ready["ready"] is True and {r["state"] for r in ready["replicas"]} == {"ready"}
    text = httpx.get(gateway.url + "/metrics").text
    assert 'grm_requests_total{replica="r' in text
    assert "grm_request_duration_seconds_bucket" in text
    assert 'grm_replica_up{replica="r0"} 1.0' in text
    assert "grm_service_info{" in text and 'seed="11"' in text


def test_failover_to_the_other_replica_then_503(tmp: Path) -> None:
    a, b = start_stub(tmp), start_stub(tmp)
    with running_gateway(tmp, "--replica-url", a.url, "--replica-url", b.url,
                         "--served-model-name", "rm",
                         timeout=60) as gw:
        owners = {i: chat(gw, seed=i).headers["x-grm-replica"] for i in range(20)}
        a.stop(signal.SIGKILL)
        for i in range(20):  # at once, before the health monitor notices
            r = chat(gw, seed=i)
            assert r.status_code == 200, r.text
            assert r.headers["x-grm-replica"] == "r1", owners[i]
        b.stop(signal.SIGKILL)
        r = chat(gw, seed=1)
        assert r.status_code in (502, 503), r.text
        assert r.headers.get("retry-after")


def test_hot_path_and_fastapi_path_agree_bitwise(gateway: Proc) -> None:
    """`max_tokens: 8.0` and `temperature: "0.5"` are left to FastAPI + pydantic (which coerce
    them); the plain spelling takes the hot path. Both must forward the same bytes: same request
    digest, same replica, same answer."""
    plain = chat(gateway, max_tokens=8, temperature=0.5)
    coerced = chat(gateway, max_tokens=8.0, temperature="0.5")
    assert plain.status_code == coerced.status_code == 200, coerced.text
    for header in ("x-grm-request-digest", "x-grm-replica", "x-grm-response-digest"):
        assert plain.headers[header] == coerced.headers[header]
    # The hot path renders its answer itself: byte for byte what the FastAPI route sends.
    assert plain.content == coerced.content
    assert [h for h in plain.headers.raw if h[0] != b"date"] == \
        [h for h in coerced.headers.raw if h[0] != b"date"]


def test_no_access_log_by_default_and_one_line_per_request_with_the_flag(
    gateway: Proc, stubs: list[Proc], tmp: Path
) -> None:
    chat(gateway)
    assert '"POST /v1/chat/completions HTTP/1.1" 200' not in gateway.log.read_text()
    urls = [a for s in stubs for a in ("--replica-url", s.url)]
    with running_gateway(tmp, *urls, "--served-model-name", "rm", timeout=60,
                         env={"GRM_ACCESS_LOG": "1"}) as logged:
        assert chat(logged).status_code == 200
        assert '"POST /v1/chat/completions HTTP/1.1" 200' in logged.log.read_text()


def _raw_exchange(gateway: Proc, data: bytes, responses: int) -> list[tuple[bytes, bytes]]:
    """Send raw bytes on one connection; read `responses` answers as (head, body)."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(gateway.url)
    out: list[tuple[bytes, bytes]] = []
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(data)
        buf = b""
        while len(out) < responses:
            while b"\r\n\r\n" not in buf:
                chunk = sock.recv(65536)
                assert chunk, f"connection closed after {len(out)} answers"
                buf += chunk
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            while len(buf) < length:
                chunk = sock.recv(65536)
                assert chunk, "connection closed mid-body"
                buf += chunk
            out.append((head, buf[:length]))
            buf = buf[length:]
        if responses and b"connection: close" in out[-1][0].lower():
            assert sock.recv(1) == b"", "the server closes after `connection: close`"
    return out


def _post(body: dict[str, object], version: str = "1.1") -> bytes:
    import json

    raw = json.dumps(body).encode()
    return (f"POST /v1/chat/completions HTTP/{version}\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n").encode() + raw


def test_pipelined_requests_are_answered_in_order(gateway: Proc) -> None:
    import json

    bodies = [{"messages": MSGS, "seed": seed} for seed in (1, 2, 3)]
    expected = [chat(gateway, seed=seed).headers["x-grm-request-digest"] for seed in (1, 2, 3)]
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    answers = _raw_exchange(gateway, _post(bodies[0]) + health + _post(bodies[1])
                            + _post(bodies[2]), 4)
    digests = [json.loads(body)["grm_fingerprint"]["request_digest"]
               for i, (_, body) in enumerate(answers) if i != 1]
    assert digests == expected
    assert json.loads(answers[1][1]) == {"status": "ok"}


def test_an_idle_connection_outlives_a_client_keep_alive(gateway: Proc) -> None:
    """The gateway keeps an idle connection longer than httpx's 5 s: a client reusing it at its
    own expiry must never meet the gateway's close (a reset: a request lost)."""
    import socket
    import time
    from urllib.parse import urlsplit

    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    url = urlsplit(gateway.url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(health)
        first = b""
        while not first.endswith(b'{"status":"ok"}'):
            chunk = sock.recv(65536)
            assert chunk, "closed before the first answer"
            first += chunk
        time.sleep(6.0)  # past uvicorn's default keep-alive (5 s), within httpx's reuse window
        sock.sendall(health)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200"), "the idle connection was closed"


def test_http_1_0_gets_one_answer_and_a_close(gateway: Proc) -> None:
    [(head, body)] = _raw_exchange(gateway, _post({"messages": MSGS}, "1.0"), 1)
    assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower()
    assert b"grm_fingerprint" in body


def test_chunked_body_is_served_too(gateway: Proc) -> None:
    r = httpx.post(gateway.url + "/v1/chat/completions", timeout=30,
                   content=iter([b'{"messages": [{"role": "user", ', b'"content": "hello"}]}']),
                   headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.headers["x-grm-request-digest"] == chat(gateway).headers["x-grm-request-digest"]


def test_the_stub_listens_before_it_tells_its_port(tmp: Path) -> None:
    # Frozen right after it printed its port (uvicorn not yet started): a client connecting then
    # waits in the backlog and is answered once the stub runs, rather than being refused.
    stub = start_stub(tmp)
    try:
        os.killpg(stub.popen.pid, signal.SIGSTOP)
        host, port = stub.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            os.killpg(stub.popen.pid, signal.SIGCONT)
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: stub\r\nconnection: close\r\n\r\n")
            assert sock.makefile("rb").readline().startswith(b"HTTP/1.1 200")
    finally:
        os.killpg(stub.popen.pid, signal.SIGCONT)
        stub.stop()
