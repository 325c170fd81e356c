from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from grm_service.client import (
    AsyncGrmClient,
    Capacity,
    GrmClient,
    RequestRejected,
    RetriesExhausted,
    RetryPolicy,
)

FAST = RetryPolicy(attempts=4, backoff_s=0.0, backoff_max_s=0.0, patience_s=0.0)


def answer(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    results = [{"id": i["id"], "score": float(len(i["id"])), "status": "ok", "digest": i["id"]}
               for i in body["items"]]
    batch = {"fingerprint_id": "grm-x", "scorer": body["scorer"], "items": len(results),
             "errors": 0, "digest": "d"}
    return httpx.Response(200, json={"results": results, "fingerprint": batch})


class Flaky:
    """Fails the first `failures` calls with the given statuses (None = connection error)."""

    def __init__(self, *failures: int | None) -> None:
        self.failures = list(failures)
        self.calls: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # /v1/capabilities: a service that does not say
            return httpx.Response(404)
        self.calls.append(json.loads(request.content))
        if self.failures:
            status = self.failures.pop(0)
            if status is None:
                raise httpx.ConnectError("refused", request=request)
            return httpx.Response(status, headers={"retry-after": "0"},
                                  json={"error": {"message": f"status {status}"}})
        return answer(request)


ITEMS = [{"id": "x" * n, "completion": "c"} for n in range(1, 8)]


def test_batches_keep_input_order_and_carry_options() -> None:
    flaky = Flaky()
    with GrmClient("http://svc/", batch_size=3, concurrency=3, retry=FAST,
                   transport=httpx.MockTransport(flaky)) as client:
        results = client.score(ITEMS, "judge", sampling={"temperature": 0}, options={"max": 5})
    assert [r.id for r in results] == [i["id"] for i in ITEMS]
    assert sorted(len(c["items"]) for c in flaky.calls) == [1, 3, 3]
    assert all(c["sampling"] == {"temperature": 0} and c["options"] == {"max": 5}
               for c in flaky.calls)


GROUPED = [{"id": f"{g}{n}", "completion": f"c{n}", "group_id": g, "group_size": 3}
           for n in range(3) for g in "ab"] + [{"id": "loose", "completion": "c"}]


async def test_a_groups_items_go_in_one_batch_with_their_group_fields() -> None:
    flaky = Flaky()
    with GrmClient("http://svc/", batch_size=4, retry=FAST,
                   transport=httpx.MockTransport(flaky)) as client:
        results = client.score(GROUPED, "pairwise")
    async with AsyncGrmClient("http://svc/", batch_size=4, retry=FAST,
                              transport=httpx.MockTransport(flaky)) as aclient:
        aresults = await aclient.score(GROUPED, "pairwise")
    assert [r.id for r in results] == [r.id for r in aresults] == [i["id"] for i in GROUPED]
    sent = [[(i["id"], i.get("group_id"), i.get("group_size")) for i in call["items"]]
            for call in flaky.calls]
    assert sent[:2] == [[("a0", "a", 3), ("a1", "a", 3), ("a2", "a", 3)],
                        [("b0", "b", 3), ("b1", "b", 3), ("b2", "b", 3), ("loose", None, None)]]
    assert sent[2:] == sent[:2]


def test_retries_on_busy_unavailable_and_connection_errors() -> None:
    flaky = Flaky(429, 503, None)
    with GrmClient("http://svc", retry=FAST, transport=httpx.MockTransport(flaky)) as client:
        assert client.score(ITEMS[:1], "judge")[0].score == 1.0
    assert len(flaky.calls) == 4


def test_gives_up_after_the_last_attempt() -> None:
    flaky = Flaky(503, 503, 503, 503)
    with (GrmClient("http://svc", retry=FAST, transport=httpx.MockTransport(flaky)) as client,
          pytest.raises(RetriesExhausted, match="4 attempts")):
        client.score(ITEMS[:1], "judge")


def test_client_errors_are_not_retried() -> None:
    flaky = Flaky(400)
    with (GrmClient("http://svc", retry=FAST, transport=httpx.MockTransport(flaky)) as client,
          pytest.raises(RequestRejected, match="HTTP 400: status 400")):
        client.score(ITEMS[:1], "nope")
    assert len(flaky.calls) == 1


def test_backoff_doubles_up_to_the_cap_and_honours_retry_after() -> None:
    policy = RetryPolicy(attempts=9, backoff_s=0.5, backoff_max_s=4)
    assert [policy.delay(n) for n in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert policy.delay(0, "3") == 3.0 and policy.delay(0, "99") == 4.0
    assert policy.delay(1, "soon") == 1.0


async def test_async_client_same_contract() -> None:
    flaky = Flaky(503, None)
    async with AsyncGrmClient("http://svc", batch_size=2, concurrency=2, retry=FAST,
                              transport=httpx.MockTransport(flaky)) as client:
        results = await client.score(ITEMS, "judge")
    assert [r.id for r in results] == [i["id"] for i in ITEMS]
    assert len(flaky.calls) == 4 + 2


async def test_api_key_and_extra_headers_reach_every_request() -> None:
    seen: list[httpx.Headers] = []

    def record(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(404)
        seen.append(request.headers)
        return answer(request)

    headers = {"x-team": "rl", "Authorization": "Bearer overridden"}
    with GrmClient("http://svc", batch_size=2, api_key="k1", headers=headers,
                   transport=httpx.MockTransport(record)) as client:
        client.score(ITEMS[:3], "judge")
    async with AsyncGrmClient("http://svc", api_key="k2",
                              transport=httpx.MockTransport(record)) as aclient:
        await aclient.score(ITEMS[:1], "judge")
    assert [h["authorization"] for h in seen] == ["Bearer k1", "Bearer k1", "Bearer k2"]
    assert seen[0]["x-team"] == "rl" and "x-team" not in seen[2]


def test_a_busy_service_is_waited_for_past_the_attempts_within_patience() -> None:
    patient = RetryPolicy(attempts=2, backoff_s=0.0, backoff_max_s=0.0, patience_s=60.0)
    flaky = Flaky(*[429] * 6, 503)
    with GrmClient("http://svc", retry=patient, transport=httpx.MockTransport(flaky)) as client:
        assert client.score(ITEMS[:1], "judge")[0].score == 1.0
    assert len(flaky.calls) == 8
    # Not a busy answer: the attempts bound it.
    with (GrmClient("http://svc", retry=patient,
                    transport=httpx.MockTransport(Flaky(502, 502, 502))) as client,
          pytest.raises(RetriesExhausted, match="after 2 attempts: HTTP 502: status 502")):
        client.score(ITEMS[:1], "judge")


async def test_patience_runs_out_with_the_services_own_message() -> None:
    brief = RetryPolicy(attempts=1, backoff_s=0.0, backoff_max_s=0.0, patience_s=0.05)
    async with AsyncGrmClient("http://svc", retry=brief,
                              transport=httpx.MockTransport(Flaky(*[429] * 10**6))) as client:
        with pytest.raises(RetriesExhausted, match=r"stayed busy .*HTTP 429: status 429"):
            await client.score(ITEMS[:1], "judge")


class Paced:
    """A service of `slots` slots that says so, and counts the batches it holds at once."""

    def __init__(self, slots: int, admitted: int = 64) -> None:
        self.caps = {"slots": slots, "score_items_admitted": admitted}
        self.now = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json=self.caps)
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.02)
        with self.lock:
            self.now -= 1
        return answer(request)


def test_score_keeps_no_more_batches_in_flight_than_the_service_serves() -> None:
    one_slot = Paced(slots=1)
    with GrmClient("http://svc", batch_size=2, concurrency=4,
                   transport=httpx.MockTransport(one_slot)) as client:
        results = client.score(ITEMS, "judge")
    assert [r.id for r in results] == [i["id"] for i in ITEMS]
    assert one_slot.most == 1  # 2 items fill twice the one slot: one batch at a time


@pytest.mark.parametrize(("slots", "admitted", "batch_size", "concurrency", "batches"), [
    (2, 64, 8, 4, 1),  # the demo on CPU: 2 replicas, one request each at a time
    (2, 64, 1, 4, 4),
    (512, 16384, 32, 4, 4),  # a GPU service: --concurrency as asked
    (64, 8, 4, 4, 2),  # no more than the service admits
    (1, 1, 16, 4, 1),
])
def test_batches_in_flight_fill_twice_the_slots_within_what_is_admitted(
    slots: int, admitted: int, batch_size: int, concurrency: int, batches: int
) -> None:
    assert Capacity(slots, admitted).batches(batch_size, concurrency) == batches
