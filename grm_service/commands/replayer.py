"""`grm-service replay LEDGER --url URL`: re-send a recorded run to any deployment and compare
every answer, bit for bit, with the one on record.

A record's body is the canonical request the engine was sent (seed and max_tokens filled in):
it is sent as it is, to the engine path it was answered on (`/v1/chat/completions` for a chat or
a `/v1/score` item, `/classify`), so the deployment under test computes exactly what the
recorded one did. The answer matches when what the model produced (`fingerprint.produced`:
content and logprobs, or a classifier's data) has the recorded response digest, computed here,
not taken from the answer. A difference is explained by `diffing.explain`: the first part of the
fingerprint that differs (identity, seed, model, engine version, device, env, the request).
An answer the deployment served from its own ledger (`cache` in its fingerprint) proves nothing
about its engines: it is counted apart, never as a match. Every differing record is named
(`difference`): the first `shown` kept for the screen, every one handed to `sink` (a file).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from grm_service.commands.diffing import explain
from grm_service.fingerprint import produced, response_digest
from grm_service.ledger.records import Record
from grm_service.ledger.store import Selection, Store

_PAGE = 500
# Differing records named on the screen; a file (`--differences`) takes every one.
SHOWN = 20


@dataclass(frozen=True)
class Outcome:
    record: Record
    matched: bool
    cause: str = ""  # why not: a diff cause, an HTTP error, "served from cache"
    detail: str = ""


def difference(outcome: Outcome) -> dict[str, Any]:
    """A differing record, named: its id, request digest, run, step, and why it differs."""
    record = outcome.record
    return {"record": record.id, "request_digest": record.request_digest,
            "run": record.origin.run or "", "step": record.origin.step, "path": record.path,
            "cause": outcome.cause, "detail": outcome.detail}


@dataclass
class Report:
    total: int = 0
    matched: int = 0
    no_body: int = 0
    causes: Counter[str] = field(default_factory=Counter)
    by_run: dict[str, list[int]] = field(default_factory=dict)  # run -> [matched, total]
    differences: list[dict[str, Any]] = field(default_factory=list)  # the first `shown`
    shown: int = SHOWN
    sink: Callable[[dict[str, Any]], None] | None = None  # takes every difference

    def add(self, outcome: Outcome) -> None:
        run = outcome.record.origin.run or ""
        counts = self.by_run.setdefault(run, [0, 0])
        counts[1] += 1
        self.total += 1
        if outcome.matched:
            self.matched += 1
            counts[0] += 1
            return
        self.causes[outcome.cause] += 1
        named = difference(outcome)
        if len(self.differences) < self.shown:
            self.differences.append(named)
        if self.sink is not None:
            self.sink(named)

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.matched == self.total

    @property
    def differing(self) -> int:
        return self.total - self.matched


def _row(record_id: str, payload: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": record_id, "status": "ok", "score": None, "response": produced(payload),
            "fingerprint": dict(fields)}


def compare(record: Record, status: int, content: bytes) -> Outcome:
    if status != 200:
        return Outcome(record, False, f"HTTP {status}", content[:300].decode(errors="replace"))
    try:
        answer = json.loads(content)
        fields = answer.pop("grm_fingerprint")
        answer.pop("system_fingerprint", None)
    except (ValueError, KeyError, AttributeError):
        return Outcome(record, False, "answer is not a grm-service answer", content[:300].decode(
            errors="replace"))
    if fields.get("cache"):
        return Outcome(record, False, "served from the target's ledger (not recomputed)")
    got = response_digest(answer)
    if got == record.response_digest:
        return Outcome(record, True)
    recorded = {**record.fields, "response_digest": record.response_digest}
    found = explain(_row(str(record.id), json.loads(record.payload), recorded),
                    _row(str(record.id), answer, {**fields, "response_digest": got}))
    if found is None:  # same output, other digest: an answer the digest reads differently
        return Outcome(record, False, "response digest differs", f"{record.response_digest} "
                       f"vs {got}")
    return Outcome(record, False, found.cause, found.detail)


async def _one(client: httpx.AsyncClient, url: str, record: Record,
               gate: asyncio.Semaphore) -> Outcome:
    assert record.body is not None
    async with gate:
        try:
            r = await client.post(url + record.path, content=record.body,
                                  headers={"content-type": "application/json"})
        except httpx.HTTPError as err:
            return Outcome(record, False, "request failed", repr(err))
    return compare(record, r.status_code, r.content)


async def _pages(store: Store, selection: Selection) -> AsyncIterator[list[Record]]:
    after = 0
    while True:
        page = await asyncio.to_thread(store.records, selection, _PAGE, after)
        yield page
        if len(page) < _PAGE:
            return
        after = page[-1].id or after


async def replay(store: Store, selection: Selection, url: str, concurrency: int,
                 headers: Mapping[str, str], timeout_s: float = 600,
                 report: Report | None = None) -> Report:
    """Every selected record re-sent, `concurrency` at a time, and compared (into `report`,
    where given: its `sink` takes every difference as it is found)."""
    report = Report() if report is None else report
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout_s, headers=dict(headers),
                                 limits=limits) as client:
        async for page in _pages(store, selection):
            kept = [r for r in page if r.body is not None]
            report.no_body += len(page) - len(kept)
            for outcome in await asyncio.gather(*(_one(client, url.rstrip("/"), r, gate)
                                                  for r in kept)):
                report.add(outcome)
    return report


def lines(report: Report) -> Iterator[tuple[str, str, str, str]]:
    """The verify-style table: per run, answers identical to the record."""
    for run, (matched, total) in report.by_run.items():
        yield (run or "(untagged)", str(matched), str(total), "yes" if matched == total else "NO")
