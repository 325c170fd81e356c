"""`grm-service verify` against a service seen through httpx.MockTransport: the load it really
puts in flight, on the service and on each replica, and the key it sends."""

from __future__ import annotations

import asyncio
import json
import zlib
from collections import Counter

import httpx
import pytest

from grm_service.commands.prober import DEFAULT_CONCURRENCY, AccessRefused, verify
from grm_service.fingerprint import digest
from grm_service.headers import PIN_HEADER
from grm_service.probes import builtin_probes

URL = "http://service.test"
REPLICAS = ("r0", "r1")
# vLLM #51187: repeats of one concurrent workload differ from about 44 co-resident sequences.
DRIFT_AT = 44


class Service:
    """Two replicas; a chat answer is a digest of the request's bytes (equal requests, equal
    answers) unless `drift_at` requests share the replica, as in vLLM #51187. Requests that
    were not pinned go to a replica by crc32 of their body, as the gateway routes them."""

    def __init__(self, key: str | None = None, drift_at: int | None = None) -> None:
        self.key, self.drift_at = key, drift_at
        self.in_flight: Counter[str] = Counter()
        self.peak: Counter[tuple[str, bool]] = Counter()  # (replica, pinned) -> most at once
        self.unkeyed = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.key and request.headers.get("authorization") != f"Bearer {self.key}":
            self.unkeyed += 1
            if request.url.path != "/ready":
                return httpx.Response(401, json={"error": {"message": "missing key"}})
            return httpx.Response(200, json={"status": "ready"})  # details need the key
        if request.url.path == "/ready":
            return httpx.Response(200, json={"replicas": [{"name": n, "state": "ready"}
                                                          for n in REPLICAS]})
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "rm"}]})
        return await self._chat(request)

    async def _chat(self, request: httpx.Request) -> httpx.Response:
        pin = request.headers.get(PIN_HEADER)
        replica = pin or REPLICAS[zlib.crc32(request.content) % len(REPLICAS)]
        self.in_flight[replica] += 1
        crowded = self.in_flight[replica]
        key = (replica, pin is not None)
        self.peak[key] = max(self.peak[key], crowded)
        await asyncio.sleep(0.005)  # long enough for every request sent at once to arrive
        self.in_flight[replica] -= 1
        text = digest(request.content)
        if self.drift_at is not None and crowded >= self.drift_at:
            text += "-drifted"
        message = {"role": "assistant", "content": text}
        return httpx.Response(200, json={"choices": [{"index": 0, "message": message,
                                                      "logprobs": None}]})


def run(service: Service, **options: object) -> dict[str, tuple[int, int]]:
    report = asyncio.run(verify(URL, builtin_probes(), transport=httpx.MockTransport(service),
                                **options))  # type: ignore[arg-type]
    return {row.condition: (row.identical, row.total) for row in report.rows}


def test_the_default_load_keeps_64_in_flight_on_each_replica_alone() -> None:
    service = Service()
    rows = run(service)
    assert DEFAULT_CONCURRENCY >= 64
    assert rows[f"concurrency {DEFAULT_CONCURRENCY}"] == (64, 64)  # 4 copies of 16 probes
    assert all(identical == total for identical, total in rows.values()), rows
    for replica in REPLICAS:
        assert service.peak[(replica, True)] >= 64
        assert rows[f"replica {replica} alone"] == (64, 64)
    routed = service.peak[("r0", False)] + service.peak[("r1", False)]
    assert routed >= 64


def test_the_default_load_finds_a_replica_that_drifts_past_44_co_resident() -> None:
    rows = run(Service(drift_at=DRIFT_AT))
    for replica in REPLICAS:
        identical, total = rows[f"replica {replica} alone"]
        assert identical < total
    # Spread over two replicas by routing, 64 in flight stay under 44 on each: the rows that
    # load one replica alone are the ones that must reach past it.
    assert rows["repeat"] == (16, 16) and rows["concurrency 8"] == (16, 16)
    below = run(Service(drift_at=DRIFT_AT), concurrency=32)
    assert all(identical == total for identical, total in below.values()), below


def test_a_keyed_service_is_verified_with_the_key_and_refused_without() -> None:
    service = Service(key="s3cret")
    rows = run(service, api_key="s3cret")
    assert service.unkeyed == 0
    assert {"replica r0 alone", "replica r1 alone"} <= set(rows)
    assert all(identical == total for identical, total in rows.values()), rows
    with pytest.raises(AccessRefused, match="--api-key or GRM_API_KEY"):
        run(Service(key="s3cret"))


def test_backpressure_is_waited_out_not_reported_as_a_difference() -> None:
    inner = Service()
    busy = {"left": 5}

    async def sometimes_busy(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/chat/completions") and busy["left"]:
            busy["left"] -= 1
            return httpx.Response(429, headers={"retry-after": "0"},
                                  content=json.dumps({"error": {"message": "queue full"}}))
        return await inner(request)

    report = asyncio.run(verify(URL, builtin_probes(4), concurrency=8,
                                transport=httpx.MockTransport(sometimes_busy)))
    assert busy["left"] == 0 and report.ok


def test_each_row_is_named_once_at_any_concurrency() -> None:
    report = asyncio.run(verify(URL, builtin_probes(4), concurrency=8,
                                transport=httpx.MockTransport(Service())))
    names = [row.condition for row in report.rows]
    assert len(names) == len(set(names)) and "concurrency 8" in names
    assert dict(zip(names, ((r.identical, r.total) for r in report.rows), strict=True))[
        "concurrency 8"] == (8, 8)
