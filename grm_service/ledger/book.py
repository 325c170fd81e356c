"""The Ledger: what the request path calls, once per answered request.

    ledger = Ledger(settings, metrics)         # the lifespan; ledger.start() / await close()
    if not ledger.may_answer(origin, pinned):  # the cache's policy, here only
        ledger.record(path, raw, origin, await compute())
    else:
        lookup = ledger.lookup_of(path, request_digest, origin, expected_id)
        found = await ledger.look_up(lookup)      # (payload, fields marked "hit"/"coalesced")
        if found is None:
            with ledger.lead(lookup) as lead:     # identical requests wait for this one
                answer, how = await compute(), ""
                lead.done(answer)
        else:
            answer, how = serve(*found), found[1]["cache"]
        ledger.record(path, raw, origin, answer, how, ledger.scope(origin))

A plain sequence the request path reads top to bottom: a request the cache may not answer
(chat, by default) pays for its record and nothing else. `expected_id` (the fingerprint id the
answer would carry) is a digest, not worth a request the cache never answers either.

`how` is "" (computed), "hit" (from the record) or "coalesced" (another request's computation).
Every answer is recorded, hits included; the cache applies per the client route's policy:
`/v1/score` items by default, `/v1/chat/completions` only with GRM_LEDGER_CACHE_CHAT; and
within one API key's requests, unless GRM_LEDGER_CACHE_SHARED (`cache.Lookup`'s scope).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from grm_service.config import LedgerBodies, Settings
from grm_service.errors import LedgerUnavailable
from grm_service.ledger.cache import Answer, Found, InFlight, Lead, Lookup, Recent
from grm_service.ledger.location import open_reader, open_store, shown
from grm_service.ledger.records import Origin, Record, fields_json
from grm_service.ledger.store import Store, row
from grm_service.ledger.writer import Writer
from grm_service.metrics import Metrics

T = TypeVar("T")
# A record's answer and fingerprint, about, as the buffer holds them (the body apart).
_RECORD_BYTES = 2048
# Fingerprint texts kept (`_fields_text`): seeds are the client's to choose.
_TEXTS = 4096
SCORE_ROUTE = "/v1/score"
CHAT_ROUTE = "/v1/chat/completions"
# Generation routes, answered from the ledger where GRM_LEDGER_CACHE_CHAT says so.
CHAT_ROUTES = frozenset({CHAT_ROUTE, "/v1/responses"})


class Ledger:
    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        # Read on every request: plain attributes, not a pydantic model's (context.RequestSettings).
        self._cache_score = settings.ledger_cache_score
        self._cache_chat = settings.ledger_cache_chat
        self._per_key = not settings.ledger_cache_shared
        self._keep_all = settings.ledger_bodies is LedgerBodies.ALL
        self._keep_tagged = settings.ledger_bodies is LedgerBodies.TAGGED
        location = settings.ledger_location
        bounds = (settings.ledger_max_bytes, settings.ledger_max_age_s)
        self.writer = Writer(partial(open_store, location), settings.ledger_flush_interval_s,
                             settings.ledger_buffer_bytes, bounds, metrics.ledger_written,
                             metrics.ledger_dropped)
        self._reader_store: Store | None = None
        self._location = location
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="grm-ledger-reader")
        self.recent = Recent()
        self._texts: dict[tuple[str, bool], str] = {}
        self.inflight = InFlight()
        self._closed = False
        self._outcomes = {how: metrics.ledger_cache.labels(outcome=how)
                          for how in ("hit", "coalesced", "miss")}

    def start(self) -> None:
        self.writer.start()

    async def close(self) -> None:
        """Write what is buffered and close both connections (idempotent)."""
        if self._closed:
            return
        self._closed = True
        await self.writer.close()
        await asyncio.get_running_loop().run_in_executor(self._reader, self._close_reader)
        self._reader.shutdown()

    def may_answer(self, origin: Origin, pinned: bool) -> bool:
        """Whether the cache may answer this request (a pinned one goes to its replica)."""
        if pinned:
            return False
        if origin.route == SCORE_ROUTE:
            return self._cache_score
        return origin.route in CHAT_ROUTES and self._cache_chat

    def lookup_of(self, path: str, request_digest: str, origin: Origin, expected_id: str) -> Lookup:
        """The cache's lookup of a request it may answer (`may_answer`): `expected_id`, the
        fingerprint id its answer would carry, and `request_digest`, its canonical body's."""
        return (expected_id, request_digest, path, self.scope(origin))

    def scope(self, origin: Origin) -> str:
        """The cache scope `origin`'s requests are looked up in (`cache.Lookup`)."""
        return origin.key_id if self._per_key else ""

    async def look_up(self, lookup: Lookup) -> Found | None:
        """`lookup`'s answer as recorded (a hit: recent here, else from the store), else as an
        identical request in flight computes it (coalesced); None where this request computes
        it, within `lead(lookup)`."""
        found = self.recent.get(lookup)
        if found is None:
            record = await self._lookup(lookup)
            if record is not None:
                found = (json.loads(record.payload), record.fields)
        how = "hit"
        if found is None:
            answer = await self.inflight.joined(lookup)
            if answer is None:
                self._outcomes["miss"].inc()
                return None
            found, how = (answer.payload, answer.fields), "coalesced"
        self._outcomes[how].inc()
        return found[0], {**found[1], "cache": how}

    @contextlib.contextmanager
    def lead(self, lookup: Lookup) -> Iterator[Lead]:
        """This request computes `lookup`'s answer (`Lead.done`) while identical ones wait."""
        with self.inflight.lead(lookup, self.recent) as lead:
            yield lead

    async def _lookup(self, lookup: Lookup) -> Record | None:
        try:
            return await self.read(lambda store: store.lookup(*lookup))
        except LedgerUnavailable:
            return None  # the store is down: compute it (the writer counts and logs)

    def record(self, path: str, raw: Sequence[bytes | memoryview], origin: Origin,
               answer: Answer, how: str = "", scope: str | None = None) -> None:
        """`scope`: the cache's scope this request's repeats look it up in (`cache.Lookup`); None
        where the cache never answers them."""
        keep = self._keep_all or (self._keep_tagged and origin.run)
        size = _RECORD_BYTES + (sum(map(len, raw)) if keep else 0)
        # The engine's bytes, where there are some, and not the payload: a record waits for
        # its write up to a flush interval, and a payload is thousands of objects for the
        # garbage collector to walk meanwhile (bytes are none).
        fields = answer.fields
        digests = (fields["fingerprint_id"], fields["request_digest"], fields["response_digest"])
        body = (raw[0] if len(raw) == 1 and type(raw[0]) is bytes else tuple(raw)) if keep else None
        self.writer.add(row(time.time(), origin, path, digests, body,
                            answer.engine_json or answer.payload, self._fields_text(answer),
                            how, scope), size)

    def _fields_text(self, answer: Answer) -> str:
        """`fields_json` of the answer's fingerprint, rendered once per stamp: without the
        columns' members, a computed answer's text is fixed by its stamp (`Forwarded.stamp_json`,
        the replica's identity and the seed) and `serialized`, and one string shared by every
        record that waits for its write is ~450 bytes fewer held per record."""
        stamp = answer.stamp_json
        if not stamp:
            return fields_json(answer.fields)
        key = (stamp, answer.fields["serialized"])
        text = self._texts.get(key)
        if text is None:
            if len(self._texts) >= _TEXTS:
                self._texts.clear()
            text = self._texts[key] = fields_json(answer.fields)
        return text

    async def read(self, query: Callable[[Store], T]) -> T:
        """Run `query` on the reader's thread, with its own connection (never the loop's)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, self._on_reader, query)

    def _on_reader(self, query: Callable[[Store], T]) -> T:
        if self._reader_store is None:
            self._reader_store = open_reader(self._location)
        return query(self._reader_store)

    def _close_reader(self) -> None:
        if self._reader_store is not None:
            self._reader_store.close()
            self._reader_store = None

    def report(self) -> dict[str, Any]:
        return {"location": shown(self._location), **self.writer.report()}
