"""Backpressure under a burst: every answer is 200 or 429, and each 429 says when to retry.

STUB backends with a delay hold each slot; the gateway gets limits far below the burst, so the
queue must overflow. Only statuses are checked here; latency and memory are measured by
benchmarks/overload.py.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from tests.support.procs import Proc, running_gateway, start_stub

REQUESTS = 500
CONCURRENCY = 128
LIMITS = {"GRM_MAX_INFLIGHT_PER_REPLICA": "2", "GRM_MAX_QUEUE": "8", "GRM_QUEUE_TIMEOUT_S": "2",
          "GRM_AUDIT_FRACTION": "0"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    tmp = tmp_path_factory.mktemp("overload")
    stubs = [start_stub(tmp, "--delay", "0.05") for _ in range(2)]
    try:
        urls = [a for s in stubs for a in ("--replica-url", s.url)]
        # --serialize off: serializing would cap each replica at 1 and bypass the inflight limit.
        with running_gateway(tmp, *urls, "--served-model-name", "rm", "--serialize", "off",
                             timeout=60, env=LIMITS) as proc:
            yield proc
    finally:
        for stub in stubs:
            stub.stop()


async def _burst(url: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=CONCURRENCY)
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(client: httpx.AsyncClient, i: int) -> httpx.Response:
        body = {"messages": [{"role": "user", "content": f"burst {i % 64}"}], "max_tokens": 4}
        async with sem:
            return await client.post("/v1/chat/completions", json=body)

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        return await asyncio.gather(*(one(client, i) for i in range(REQUESTS)))


def test_burst_answers_only_200_or_429_with_retry_after(gateway: Proc) -> None:
    responses = asyncio.run(_burst(gateway.url))
    statuses = Counter(r.status_code for r in responses)
    assert set(statuses) <= {200, 429}, f"{statuses}: {_first_other(responses)}"
    assert statuses[429] > 0, f"the burst never overflowed the queue: {statuses}"
    assert statuses[200] > 0, f"nothing was admitted: {statuses}"
    refused = [r for r in responses if r.status_code == 429]
    missing = [r.text for r in refused if not r.headers.get("retry-after", "").isdigit()]
    assert not missing, f"{len(missing)} 429s without a Retry-After in seconds: {missing[0]}"
    assert all(r.json()["error"]["type"] == "rate_limit_error" for r in refused)
    assert all(r.json()["error"]["code"] == "overloaded" for r in refused)


def _first_other(responses: list[httpx.Response]) -> str:
    other = next(r for r in responses if r.status_code not in (200, 429))
    return f"{other.status_code} {other.text[:500]}"


def test_service_recovers_after_the_burst(gateway: Proc) -> None:
    r = httpx.post(gateway.url + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "after"}]}, timeout=30)
    assert r.status_code == 200, r.text
    ready = httpx.get(gateway.url + "/ready", timeout=5).json()
    assert all(rep["in_flight"] == 0 for rep in ready["replicas"]), ready
