"""Refusals of the gateway itself (auth, body size, images), in front of STUB backends."""

from __future__ import annotations

import base64
import io
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image

from tests.support.procs import DEADLINE_S, Proc, running_gateway, start_stub, wait_until

KEY = "s3cret-key"


def png(width: int = 8, height: int = 8) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(buf, "PNG")
    return buf.getvalue()


def data_url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def image_message(url: str) -> list[dict[str, object]]:
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "read"}]
    return [{"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    tmp = tmp_path_factory.mktemp("limits")
    keys = tmp / "keys"
    keys.write_text("# one per line\nother-key\n" + KEY + "\n")
    stub = start_stub(tmp)
    try:
        with running_gateway(tmp, "--replica-url", stub.url, "--served-model-name", "rm",
                             timeout=60,
                             env={"GRM_API_KEYS_FILE": str(keys),
                                  "GRM_MAX_BODY_BYTES": "200000",
                                  "GRM_MAX_IMAGE_BYTES": "100000",
                                  "GRM_MAX_IMAGE_PIXELS": "10000",
                                  "GRM_IMAGE_URL_ALLOWLIST": "https://images.internal/"}) as gw:
            yield gw
    finally:
        stub.stop()


def post(gw: Proc, body: object, key: str | None = KEY, **kw: object) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30,
                      **kw)  # type: ignore[arg-type]


def ok_body() -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("key", [None, "wrong", "s3cret-ke", KEY + "x"])
def test_missing_or_wrong_key_is_401(gateway: Proc, key: str | None) -> None:
    r = post(gateway, ok_body(), key=key)
    assert r.status_code == 401
    assert "Authorization: Bearer" in r.json()["error"]["message"]
    assert r.headers["www-authenticate"] == "Bearer"


def test_keys_from_file_work_and_health_stays_open(gateway: Proc) -> None:
    assert post(gateway, ok_body()).status_code == 200
    assert post(gateway, ok_body(), key="other-key").status_code == 200
    assert httpx.get(gateway.url + "/health").status_code == 200
    assert httpx.get(gateway.url + "/ready").status_code == 200
    assert httpx.get(gateway.url + "/metrics").status_code == 200  # metrics_auth is off
    assert httpx.get(gateway.url + "/v1/fingerprint").status_code == 401


def test_oversized_body_is_413(gateway: Proc) -> None:
    big = {"messages": [{"role": "user", "content": "x" * 300_000}]}
    r = post(gateway, big)
    assert r.status_code == 413
    assert "limit is 200000" in r.json()["error"]["message"]


def test_chunked_oversized_body_is_413(gateway: Proc) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(30):
            yield b"y" * 10_000
        yield b'"}]}'

    r = httpx.post(gateway.url + "/v1/chat/completions", content=chunks(), timeout=30,
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 413


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://169.254.169.254/latest/meta-data", "server-side request forgery"),
        ("https://example.com/cat.png", "GRM_IMAGE_URL_ALLOWLIST"),
        ("data:image/png;base64,not base64!", "not valid base64"),
        (data_url(b"definitely not an image"), "cannot be decoded"),
        (data_url(png()[:40]), "cannot be decoded"),
        (data_url(png(200, 200)), "limit is 10000 pixels"),
        ("data:image/png,rawbytes", "base64-encoded"),
    ],
)
def test_bad_images_are_400_with_reason(gateway: Proc, url: str, message: str) -> None:
    r = post(gateway, {"messages": image_message(url)})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"]


def test_good_and_allowlisted_images_pass(gateway: Proc) -> None:
    assert post(gateway, {"messages": image_message(data_url(png()))}).status_code == 200
    allowed = image_message("https://images.internal/a.png")
    assert post(gateway, {"messages": allowed}).status_code == 200


def test_no_500_from_malformed_json(gateway: Proc) -> None:
    r = httpx.post(gateway.url + "/v1/chat/completions", content=b"{not json",
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_json"
    assert "line 1, column 2 (byte 1): expected a property name" in r.json()["error"]["message"]


def test_drain_on_sigterm(tmp_path: Path) -> None:
    stub = start_stub(tmp_path)
    try:
        with running_gateway(tmp_path, "--replica-url", stub.url, "--served-model-name", "rm",
                             timeout=60) as gw:
            # From now on the STUB holds each request until released (the canary has passed):
            # the request stays in flight for as long as the checks below take.
            httpx.post(stub.url + "/stub/hold").raise_for_status()
            result: dict[str, int] = {}

            def inflight() -> None:
                result["status"] = httpx.post(gw.url + "/v1/chat/completions", json=ok_body(),
                                              timeout=DEADLINE_S).status_code

            worker = threading.Thread(target=inflight)
            worker.start()
            wait_until(lambda: httpx.get(stub.url + "/stub/overlap").json()["in_flight"] == 1,
                       "the request reached the STUB")
            gw.popen.send_signal(signal.SIGTERM)
            wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 503, "draining")
            refused = httpx.post(gw.url + "/v1/chat/completions", json=ok_body(), timeout=30)
            assert refused.status_code == 503
            assert worker.is_alive() and gw.popen.poll() is None, "the drain waits for it"
            httpx.post(stub.url + "/stub/release").raise_for_status()
            worker.join(DEADLINE_S)
            assert result["status"] == 200, "the in-flight request must finish"
            assert gw.popen.wait(DEADLINE_S) == 0
    finally:
        stub.stop()
