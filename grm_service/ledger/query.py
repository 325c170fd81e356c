"""The ledger read back: the views the CLI, `GET /v1/ledger/...` and `replay` show.

An export row is what `grm-service diff` reads: `id` (the request digest, `#n` on its n-th
repeat in the file), `status`, `score` (none: the ledger keeps answers, a scorer's score is the
trainer's), `response` (what the model produced) and the `fingerprint`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from grm_service.digits import INT64_MAX, decimal
from grm_service.fingerprint import produced
from grm_service.ledger.records import Record
from grm_service.ledger.store import Selection, Store

PAGE = 500
_RUNS_NAMED = 8


def parse_steps(text: str | None) -> tuple[int | None, int | None]:
    """`a:b` (both included), `a:`, `:b` or `a`; ValueError naming the form otherwise."""
    if not text:
        return None, None
    low, sep, high = text.partition(":")
    first = _step(low, text)
    last = _step(high, text) if sep else first
    if first is not None and last is not None and last < first:
        raise ValueError(f"steps {text[:60]!r}: the last step is before the first")
    return first, last


def _step(part: str, text: str) -> int | None:
    if not part:
        return None
    step = decimal(part)
    if step is None:
        raise ValueError(f"steps {text[:60]!r}: expected a:b, a:, :b or a, each step between 0 "
                         f"and {INT64_MAX} in ASCII digits")
    return step


def nothing_selected(store: Store, run: str | None, steps: str | None,
                     request_digest: str | None = None) -> str:
    """What to say where a selection holds no record: what it asked for, and the runs that are
    on record (the first few; `grm-service ledger runs` lists them all)."""
    asked = " ".join(part for part in (
        f"--run {run!r}" if run is not None else "", f"--steps {steps}" if steps else "",
        f"--request-digest {request_digest}" if request_digest else "") if part)
    by = f" by {asked}" if asked else ""
    runs = store.runs()
    if not runs:
        return f"no record selected{by}: the ledger holds no records"
    named = ", ".join(_run_line(r) for r in runs[:_RUNS_NAMED])
    more = f" and {len(runs) - _RUNS_NAMED} more" if len(runs) > _RUNS_NAMED else ""
    return (f"no record selected{by}; runs on record: {named}{more} (`grm-service ledger "
            "runs` lists them, `grm-service ledger steps RUN` a run's steps)")


def _run_line(run: dict[str, Any]) -> str:
    name = repr(run["run"]) + (" (untagged)" if run["run"] == "" else "")
    steps = (f", steps {run['first_step']}:{run['last_step']}"
             if run["first_step"] is not None else "")
    return f"{name}: {run['requests']} record(s){steps}"


def summary(record: Record) -> dict[str, Any]:
    o = record.origin
    return {"id": record.id, "at": record.at, "run": o.run or "", "step": o.step,
            "route": o.route, "path": record.path, "fingerprint_id": record.fingerprint_id,
            "request_digest": record.request_digest, "response_digest": record.response_digest,
            "cache": record.cache, "body_kept": record.body is not None}


def detail(record: Record) -> dict[str, Any]:
    """One request whole: its body (as sent to the engine), its answer and fingerprint."""
    return {**summary(record),
            "request": None if record.body is None else json.loads(record.body),
            "answer": json.loads(record.payload), "fingerprint": record.fields}


def all_records(store: Store, selection: Selection) -> Iterator[Record]:
    """Every selected record, a page at a time."""
    after = 0
    while True:
        page = store.records(selection, PAGE, after)
        yield from page
        if len(page) < PAGE:
            return
        after = page[-1].id or after


def export_rows(records: Iterable[Record],
                seen: dict[str, int] | None = None) -> Iterator[dict[str, Any]]:
    """`seen`: repeats counted so far (pass the same dict for every page of one export)."""
    seen = {} if seen is None else seen
    for record in records:
        n = seen.get(record.request_digest, 0)
        seen[record.request_digest] = n + 1
        yield {"id": record.request_digest + (f"#{n}" if n else ""), "status": "ok",
               "score": None, "response": produced(json.loads(record.payload)),
               "fingerprint": record.fields, "run": record.origin.run or "",
               "step": record.origin.step, "record": record.id}
