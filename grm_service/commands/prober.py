"""`grm-service verify`: prove a running service deterministic under load, or show where not.

Every condition sends the same probe set in a different way and compares each answer's output
(content and logprobs, bit for bit) with a reference run made one request at a time.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx

from grm_service.fingerprint import response_digest
from grm_service.headers import PIN_HEADER
from grm_service.probes import filler_requests

Outcome = dict[str, Any]


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

    async def one(self, body: dict[str, Any], pin: str | None = None) -> Outcome:
        headers = {PIN_HEADER: pin} if pin else {}
        r = await self.client.post(self.url + "/v1/chat/completions", json=body, headers=headers)
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


async def _with_filler(prober: Prober, bodies: list[dict[str, Any]]) -> list[Outcome]:
    filler = filler_requests(len(bodies) * 2)
    mixed = await prober.run(bodies + filler, 32)
    return mixed[: len(bodies)]


async def verify(url: str, bodies: list[dict[str, Any]], timeout_s: float = 600,
                 on_row: Callable[[Row], None] | None = None) -> Report:
    report = Report()
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        prober = Prober(client, url)
        reference = await prober.run(bodies, 1)
        conditions: list[tuple[str, Callable[[], Awaitable[list[Outcome]]]]] = [
            ("repeat", lambda: prober.run(bodies, 1)),
            ("concurrency 8", lambda: prober.run(bodies, 8)),
            ("concurrency 64", lambda: prober.run(bodies, 64)),
            ("shuffled order", lambda: _shuffled(prober, bodies)),
            ("mixed with filler traffic", lambda: _with_filler(prober, bodies)),
        ]
        for name in await prober.replicas():
            conditions.append((f"replica {name} alone", partial(prober.run, bodies, 8, name)))
        for condition, run in conditions:
            row = compare(condition, reference, await run())
            report.rows.append(row)
            if on_row is not None:
                on_row(row)
    return report
