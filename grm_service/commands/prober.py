"""`grm-service verify`: prove a running service deterministic under load, or show where not.

Every condition sends the same probe set in a different way and compares each answer's output
(content and logprobs, bit for bit) with a reference run made one request at a time. The loaded
conditions keep `concurrency` requests in flight at once (copies of the probes, or the probes
among filler), and each replica gets that load on its own (pinned): vLLM #51187 sees
VLLM_BATCH_INVARIANT=1 outputs differ between repeats of one concurrent workload from about 44
co-resident sequences on, so the default (64) must reach past it on every replica.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx

from grm_service.client import GrmClientError, auth_headers
from grm_service.fingerprint import response_digest
from grm_service.headers import PIN_HEADER
from grm_service.probes import filler_requests

Outcome = dict[str, Any]
# Requests in flight at once in the loaded conditions: above the ~44 co-resident sequences at
# which vLLM #51187 reports batch invariance breaking.
DEFAULT_CONCURRENCY = 64
# A 429 is the service's backpressure, not an answer: wait and send again, this many times.
_BUSY_RETRIES = 8


class AccessRefused(GrmClientError):
    """The service wants a key (401) or refuses the one given (403)."""


@dataclass
class Row:
    condition: str
    identical: int
    total: int
    first_mismatch: tuple[int, Outcome, Outcome] | None = None

    @property
    def complete(self) -> bool:
        return self.total > 0 and self.identical == self.total


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(row.complete for row in self.rows)


def output_of(payload: dict[str, Any]) -> Outcome:
    """What must repeat bit for bit (`digest`: the response digest the answer's fingerprint
    carries, computed here from the answer), and the fingerprint that explains it."""
    choices = [{"content": (c.get("message") or {}).get("content"), "logprobs": c.get("logprobs")}
               for c in payload.get("choices", [])]
    return {"output": choices, "digest": response_digest(payload),
            "fingerprint": payload.get("grm_fingerprint", {})}


class Prober:
    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        self.client = client
        self.url = url.rstrip("/")

    async def check_access(self) -> None:
        r = await self.client.get(self.url + "/v1/models")
        if r.status_code in (401, 403):
            raise AccessRefused(f"{self.url} refused the probes (HTTP {r.status_code}): give its "
                                "key with --api-key or GRM_API_KEY")

    async def one(self, body: dict[str, Any], pin: str | None = None) -> Outcome:
        headers = {PIN_HEADER: pin} if pin else {}
        for attempt in range(_BUSY_RETRIES + 1):
            r = await self.client.post(self.url + "/v1/chat/completions", json=body,
                                       headers=headers)
            if r.status_code != 429 or attempt == _BUSY_RETRIES:
                break
            await asyncio.sleep(_retry_after(r))
        if r.status_code != 200:
            return {"output": None, "digest": f"HTTP {r.status_code}: {r.text[:300]}",
                    "fingerprint": {}}
        return output_of(r.json())

    async def run(self, bodies: list[dict[str, Any]], concurrency: int,
                  pin: str | None = None) -> list[Outcome]:
        limit = asyncio.Semaphore(concurrency)

        async def bounded(body: dict[str, Any]) -> Outcome:
            async with limit:
                return await self.one(body, pin)

        return list(await asyncio.gather(*(bounded(b) for b in bodies)))

    async def replicas(self) -> list[str]:
        r = await self.client.get(self.url + "/ready")
        return [rep["name"] for rep in r.json().get("replicas", []) if rep["state"] == "ready"]


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(max(float(response.headers.get("retry-after", "1")), 0.1), 30.0)
    except ValueError:
        return 1.0


def compare(condition: str, reference: list[Outcome], outcomes: list[Outcome]) -> Row:
    row = Row(condition, 0, len(reference))
    for index, (ref, got) in enumerate(zip(reference, outcomes, strict=True)):
        if ref["output"] is not None and ref["digest"] == got["digest"]:
            row.identical += 1
        elif row.first_mismatch is None:
            row.first_mismatch = (index, ref, got)
    return row


async def _shuffled(prober: Prober, bodies: list[dict[str, Any]]) -> list[Outcome]:
    order = list(range(len(bodies)))
    random.Random(0).shuffle(order)
    got = await prober.run([bodies[i] for i in order], 8)
    result: list[Outcome] = [{}] * len(bodies)
    for position, index in enumerate(order):
        result[index] = got[position]
    return result


async def _with_filler(prober: Prober, bodies: list[dict[str, Any]],
                       concurrency: int) -> list[Outcome]:
    filler = filler_requests(max(len(bodies) * 2, concurrency - len(bodies)))
    mixed = await prober.run(bodies + filler, concurrency)
    return mixed[: len(bodies)]


def copies(bodies: list[dict[str, Any]], concurrency: int) -> int:
    """Copies of the probe set that keep `concurrency` requests in flight; each copy must
    answer as the reference did."""
    return max(1, math.ceil(concurrency / len(bodies)))


Condition = tuple[str, Callable[[], Awaitable[list[Outcome]]]]


def conditions(prober: Prober, bodies: list[dict[str, Any]], concurrency: int,
               replicas: list[str]) -> list[Condition]:
    loaded = bodies * copies(bodies, concurrency)
    rows: list[Condition] = [("repeat", lambda: prober.run(bodies, 1))]
    if concurrency != 8:
        rows.append(("concurrency 8", lambda: prober.run(bodies, 8)))
    rows += [
        (f"concurrency {concurrency}", lambda: prober.run(loaded, concurrency)),
        ("shuffled order", lambda: _shuffled(prober, bodies)),
        ("mixed with filler traffic", lambda: _with_filler(prober, bodies, concurrency)),
    ]
    rows += [(f"replica {name} alone", partial(prober.run, loaded, concurrency, name))
             for name in replicas]
    return rows


async def verify(url: str, bodies: list[dict[str, Any]], timeout_s: float = 600,
                 on_row: Callable[[Row], None] | None = None, *, api_key: str | None = None,
                 concurrency: int = DEFAULT_CONCURRENCY,
                 transport: httpx.AsyncBaseTransport | None = None) -> Report:
    """AccessRefused before any probe when the service wants a key it was not given."""
    report = Report()
    async with httpx.AsyncClient(timeout=timeout_s, headers=auth_headers(api_key),
                                 transport=transport) as client:
        prober = Prober(client, url)
        await prober.check_access()
        reference = await prober.run(bodies, 1)
        for condition, run in conditions(prober, bodies, concurrency, await prober.replicas()):
            outcomes = await run()
            row = compare(condition, reference * (len(outcomes) // len(bodies)), outcomes)
            report.rows.append(row)
            if on_row is not None:
                on_row(row)
    return report
