"""The benchmarks' fast stub (`benchmarks/harness/stub_server.py --fast`) answers the engine
routes with the stub app's bytes, so a run on it measures the gateway on the same answers."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BODY = json.dumps({"model": "rm", "messages": [{"role": "user", "content": "héllo"}],
                   "seed": 3}).encode()


@contextmanager
def _stub(*flags: str) -> Iterator[int]:
    with subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "harness" / "stub_server.py"),
                           "--port", "0", *flags], stdout=subprocess.PIPE,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}) as proc:
        try:
            assert proc.stdout is not None
            port = int(proc.stdout.readline().split()[1])
            _await_health(port)
            yield port
        finally:
            proc.terminate()
            proc.wait(10)


def _await_health(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.1)
        finally:
            conn.close()
    raise AssertionError(f"the stub on port {port} never answered /health")


def _answers(port: int) -> list[tuple[int, list[tuple[str, str]], bytes]]:
    """Two chat answers and a classify answer on one kept-alive connection, then /v1/models
    (the app's route), each with its headers but the date."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    out = []
    try:
        for path, body in [("/v1/chat/completions", BODY), ("/v1/chat/completions", BODY),
                           ("/classify", b'{"model": "rm", "input": "x"}')]:
            conn.request("POST", path, body=body, headers={"content-type": "application/json"})
            r = conn.getresponse()
            out.append((r.status, sorted(h for h in r.getheaders() if h[0] != "date"),
                        r.read()))
        conn.request("GET", "/v1/models")
        r = conn.getresponse()
        out.append((r.status, [], r.read()))
    finally:
        conn.close()
    return out


def test_the_fast_stub_answers_the_app_stubs_bytes() -> None:
    with _stub() as port:
        app = _answers(port)
    with _stub("--fast") as port:
        fast = _answers(port)
    assert app[0][2].startswith(b'{"id":"chatcmpl-stub"')
    assert fast == app


def test_the_fast_stub_waits_its_delay() -> None:
    with _stub("--fast", "--delay", "0.3") as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            start = time.monotonic()
            conn.request("POST", "/v1/chat/completions", body=BODY)
            response = conn.getresponse()
            response.read()
        finally:
            conn.close()
        assert response.status == 200
        assert time.monotonic() - start >= 0.3
