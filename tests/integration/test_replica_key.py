"""A replica behind vLLM's `--api-key`: the gateway sends the key it holds
(`GRM_REPLICA_API_KEY`) on every request to it, or says it lacks one.

STUB replica (its `--api-key` guards the routes vLLM's does), the gateway under test. That
launched replicas start with the key is `tests/unit/test_config.py`'s."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.procs import Proc, running_gateway, start_gateway, start_stub, wait_until

KEY = "replica-s3cret"
BODY = {"model": "rm", "messages": [{"role": "user", "content": "Grade this answer."}]}


@pytest.fixture(scope="module")
def keyed_stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    stub = start_stub(tmp_path_factory.mktemp("keyed"), "--api-key", KEY)
    try:
        # What the tests below rely on: the stub refuses as vLLM does, and only there.
        assert httpx.post(stub.url + "/v1/chat/completions", json=BODY).status_code == 401
        assert httpx.get(stub.url + "/health").status_code == 200
        yield stub
    finally:
        stub.stop()


# With workers, the keeper's own process probes the replica and each worker sends to it.
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_gateway_holding_the_key_admits_the_replica_and_never_shows_the_key(
        tmp_path: Path, keyed_stub: Proc, workers: str) -> None:
    with running_gateway(tmp_path, "--replica-url", keyed_stub.url, "--served-model-name", "rm",
                         "--workers", workers, timeout=60,
                         env={"GRM_REPLICA_API_KEY": KEY}) as gw:
        answer = httpx.post(gw.url + "/v1/chat/completions", json=BODY, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"].startswith("stub-")
        shown = [answer.text, *(httpx.get(gw.url + path, timeout=30).text
                                for path in ("/ready", "/v1/fingerprint", "/metrics"))]
    assert not [text for text in shown if KEY in text]
    assert KEY not in gw.log.read_text(errors="replace")


def test_a_gateway_without_the_key_names_the_setting(tmp_path: Path, keyed_stub: Proc) -> None:
    gw = start_gateway(tmp_path, "--replica-url", keyed_stub.url, "--served-model-name", "rm")

    def refused_for_the_key() -> bool:
        replicas = httpx.get(gw.url + "/ready", timeout=5).json()["replicas"]
        return "set GRM_REPLICA_API_KEY" in replicas[0]["detail"]

    try:
        wait_until(refused_for_the_key, "the replica refused, with the setting named")
        answer = httpx.post(gw.url + "/v1/chat/completions", json=BODY, timeout=30)
        assert answer.status_code == 503, answer.text
    finally:
        gw.stop()
