"""Python client of `POST /v1/score`, sync and async: batching, bounded concurrency, retries.

    with GrmClient("http://127.0.0.1:8000") as client:
        results = client.score([{"id": "a", "image": data_url, "reference": "HELLO"}], "ocr")
        results[0].score, results[0].fingerprint

429/502/503/504 and connection errors are retried with exponential backoff (honouring
Retry-After); any other refusal raises `RequestRejected` at once. A busy service (429, 503) is
waited for beyond the attempts, for up to `RetryPolicy.patience_s`: a slow deployment finishes
the job late rather than failing it. `score` paces itself to the service: it keeps no more
batches in flight than the service's replicas serve (`GET /v1/capabilities`, `Capacity`).
Item errors are not exceptions: they come back as results with `status == "error"`. A service
started with `GRM_API_KEYS` wants `api_key=...` (sent as `Authorization: Bearer <key>`);
`headers` adds any others (a proxy's).
`run=...` and `score(..., step=N)` tag the requests on the service's ledger, so that the answers
behind a training run's rewards can be found, exported and replayed by run and step.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from grm_service.headers import RUN_HEADER, STEP_HEADER
from grm_service.wire import ItemResult, ScoreItem, ScoreResponse

RETRY_STATUSES = frozenset({429, 502, 503, 504})
ItemLike = ScoreItem | Mapping[str, Any]


class GrmClientError(Exception):
    """Base of the client's errors."""


class RequestRejected(GrmClientError):
    """The service refused the batch itself (4xx): retrying would not help."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class RetriesExhausted(GrmClientError):
    """The service stayed unavailable through every retry."""


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts`: tries of one batch; `patience_s`: past them, how long a batch is still
    retried while the service answers 429 or 503 (busy, starting), counted from its first
    try (0: such answers are tries like any failure)."""

    attempts: int = 6
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0
    patience_s: float = 900.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        """Seconds before retry number `attempt` (0-based): Retry-After if given, else 2^n."""
        if retry_after:
            try:
                return min(max(float(retry_after), 0.0), self.backoff_max_s)
            except ValueError:
                pass
        return float(min(self.backoff_s * 2**attempt, self.backoff_max_s))

    def gives_up(self, tries: int, since: float, busy: bool) -> bool:
        """After `tries` failed tries of a batch first sent at `since` (time.monotonic())."""
        if tries < self.attempts:
            return False
        return not busy or time.monotonic() - since >= self.patience_s

    def exhausted(self, tries: int, since: float, last: _Retry) -> RetriesExhausted:
        if last.busy and self.patience_s > 0:
            return RetriesExhausted(
                f"the service stayed busy for {time.monotonic() - since:.0f} s (patience "
                f"{self.patience_s:g} s, {tries} tries): {last}")
        return RetriesExhausted(f"gave up after {tries} attempts: {last}")


BUSY_STATUSES = frozenset({429, 503})


class _Retry(Exception):
    def __init__(self, reason: str, retry_after: str | None = None, busy: bool = False) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        self.busy = busy


@dataclass(frozen=True)
class Capacity:
    """What the service says it serves (`GET /v1/capabilities`): `slots`, requests its ready
    replicas serve at once; `admitted`, score items it accepts at once; `max_tokens`, the cap
    of a scorer's max_tokens where a batch's sampling sets none."""

    slots: int
    admitted: int
    max_tokens: int | None = None

    def batches(self, batch_size: int, concurrency: int) -> int:
        """Batches to keep in flight: items for twice the slots (every slot stays busy while a
        batch's last items finish), within what the service accepts, within `concurrency`."""
        wanted = -(-2 * self.slots // batch_size)
        fits = max(1, self.admitted // batch_size)
        return max(1, min(concurrency, wanted, fits))


def capacity_of(response: httpx.Response) -> Capacity | None:
    """None where the service does not say (an older one, a proxy in front)."""
    try:
        caps = response.json() if response.status_code == 200 else {}
        slots, admitted = int(caps["slots"]), int(caps["score_items_admitted"])
        cap = caps.get("score_max_tokens")
        return Capacity(max(slots, 1), max(admitted, 1), int(cap) if cap else None)
    except (ValueError, KeyError, TypeError):
        return None


def auth_headers(
    api_key: str | None, headers: Mapping[str, str] | None = None, run: str | None = None
) -> dict[str, str]:
    """Headers of every request: the extra ones, the run tag, then the bearer key (which
    wins)."""
    out = dict(headers or {})
    if run:
        out[RUN_HEADER] = run
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


def step_headers(step: int | None) -> dict[str, str]:
    return {} if step is None else {STEP_HEADER: str(step)}


def as_items(items: Iterable[ItemLike]) -> list[ScoreItem]:
    return [i if isinstance(i, ScoreItem) else ScoreItem.from_json(i) for i in items]


def chunks(items: Sequence[ScoreItem], size: int) -> list[list[int]]:
    """Batches of at most `size` items, as input positions: the items of one `group_id` stay in
    one batch (a group scorer judges a group whole; a group larger than `size` is a batch of its
    own), in order of their group's first item. Without group ids: consecutive slices."""
    units: dict[object, list[int]] = {}
    for index, item in enumerate(items):
        units.setdefault(index if item.group_id is None else ("group", item.group_id),
                         []).append(index)
    batches: list[list[int]] = []
    for unit in units.values():
        if batches and len(batches[-1]) + len(unit) <= size:
            batches[-1] += unit
        else:
            batches.append(list(unit))
    return batches


def in_input_order(batches: Sequence[Sequence[int]],
                   answers: Iterable[ScoreResponse]) -> list[ItemResult]:
    """The batches' results put back at their items' input positions."""
    placed: dict[int, ItemResult] = {}
    for positions, answer in zip(batches, answers, strict=True):
        placed.update(zip(positions, answer.results, strict=True))
    return [placed[i] for i in range(len(placed))]


def request_body(
    items: Sequence[ScoreItem], scorer: str, sampling: Mapping[str, Any] | None,
    options: Mapping[str, Any] | None,
) -> dict[str, Any]:
    return {"scorer": scorer, "items": [i.to_json() for i in items],
            "sampling": dict(sampling or {}), "options": dict(options or {})}


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:500]


def parse(response: httpx.Response) -> ScoreResponse:
    """The batch's answer, or _Retry / RequestRejected."""
    status = response.status_code
    if status in RETRY_STATUSES:
        # The service's message names what refused and what to change.
        raise _Retry(f"HTTP {status}: {_message(response)}", response.headers.get("retry-after"),
                     busy=status in BUSY_STATUSES)
    if status >= 400:
        raise RequestRejected(status, _message(response))
    return ScoreResponse.from_json(response.json())


def in_flight(capacity: Capacity | None, batch_size: int, concurrency: int) -> int:
    """Batches a client keeps in flight: `concurrency`, within what the service serves."""
    return concurrency if capacity is None else capacity.batches(batch_size, concurrency)


class _Cached:
    """The service's `Capacity` as last looked up: replicas come and go, so at most a minute
    old."""

    TTL_S = 60.0

    def __init__(self) -> None:
        self.value: Capacity | None = None
        self._at = -math.inf

    def fresh(self) -> bool:
        return time.monotonic() - self._at < self.TTL_S

    def keep(self, value: Capacity | None) -> Capacity | None:
        self.value, self._at = value, time.monotonic()
        return value


class GrmClient:
    """Blocking client; batches of one call run on `concurrency` threads at most."""

    def __init__(
        self, url: str, *, batch_size: int = 32, concurrency: int = 4, timeout: float = 900.0,
        retry: RetryPolicy | None = None, transport: httpx.BaseTransport | None = None,
        api_key: str | None = None, headers: Mapping[str, str] | None = None,
        run: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.batch_size, self.concurrency = batch_size, concurrency
        self.retry = retry or RetryPolicy()
        self._http = httpx.Client(timeout=timeout, transport=transport,
                                  headers=auth_headers(api_key, headers, run))
        self._capacity = _Cached()

    def __enter__(self) -> GrmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def score(
        self, items: Iterable[ItemLike], scorer: str, *, sampling: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None, step: int | None = None,
    ) -> list[ItemResult]:
        """Every item's result, in input order; `step` tags them on the ledger."""
        given = as_items(items)
        batches = chunks(given, self.batch_size)
        workers = self.in_flight(self.capacity()) if len(batches) > 1 else 1
        with ThreadPoolExecutor(max(1, min(workers, len(batches)))) as pool:
            answers = pool.map(lambda b: self.score_batch([given[i] for i in b], scorer,
                                                          sampling, options, step), batches)
            return in_input_order(batches, answers)

    def score_batch(
        self, items: Sequence[ItemLike], scorer: str,
        sampling: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
        step: int | None = None,
    ) -> ScoreResponse:
        """One `POST /v1/score`, retried while the service is busy or unreachable."""
        body = request_body(as_items(items), scorer, sampling, options)
        tags, since, tries = step_headers(step), time.monotonic(), 0
        while True:
            try:
                return parse(self._http.post(self.url + "/v1/score", json=body, headers=tags))
            except httpx.TransportError as err:
                reason = _Retry(repr(err))
            except _Retry as err:
                reason = err
            tries += 1
            if self.retry.gives_up(tries, since, reason.busy):
                raise self.retry.exhausted(tries, since, reason)
            time.sleep(self.retry.delay(tries - 1, reason.retry_after))

    def capacity(self) -> Capacity | None:
        """What the service serves at once (`Capacity`), looked up at most once a minute."""
        if self._capacity.fresh():
            return self._capacity.value
        try:
            found = capacity_of(self._http.get(self.url + "/v1/capabilities"))
        except httpx.HTTPError:
            found = None
        return self._capacity.keep(found)

    def in_flight(self, capacity: Capacity | None) -> int:
        """Batches `score` keeps in flight: `concurrency`, within what the service serves."""
        return in_flight(capacity, self.batch_size, self.concurrency)


class AsyncGrmClient:
    """The same for asyncio code (TRL async reward functions, services)."""

    def __init__(
        self, url: str, *, batch_size: int = 32, concurrency: int = 4, timeout: float = 900.0,
        retry: RetryPolicy | None = None, transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = None, headers: Mapping[str, str] | None = None,
        run: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.batch_size, self.concurrency = batch_size, concurrency
        self.retry = retry or RetryPolicy()
        self._http = httpx.AsyncClient(timeout=timeout, transport=transport,
                                       headers=auth_headers(api_key, headers, run))
        self._capacity = _Cached()

    async def __aenter__(self) -> AsyncGrmClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def score(
        self, items: Iterable[ItemLike], scorer: str, *, sampling: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None, step: int | None = None,
    ) -> list[ItemResult]:
        given = as_items(items)
        batches = chunks(given, self.batch_size)
        gate = asyncio.Semaphore(self.in_flight(await self.capacity()) if len(batches) > 1
                                 else 1)

        async def one(batch: list[int]) -> ScoreResponse:
            async with gate:
                return await self.score_batch([given[i] for i in batch], scorer, sampling,
                                              options, step)

        answers = await asyncio.gather(*(one(b) for b in batches))
        return in_input_order(batches, answers)

    async def score_batch(
        self, items: Sequence[ItemLike], scorer: str,
        sampling: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
        step: int | None = None,
    ) -> ScoreResponse:
        body = request_body(as_items(items), scorer, sampling, options)
        tags, since, tries = step_headers(step), time.monotonic(), 0
        while True:
            try:
                return parse(await self._http.post(self.url + "/v1/score", json=body,
                                                   headers=tags))
            except httpx.TransportError as err:
                reason = _Retry(repr(err))
            except _Retry as err:
                reason = err
            tries += 1
            if self.retry.gives_up(tries, since, reason.busy):
                raise self.retry.exhausted(tries, since, reason)
            await asyncio.sleep(self.retry.delay(tries - 1, reason.retry_after))

    async def capacity(self) -> Capacity | None:
        """What the service serves at once (`Capacity`), looked up at most once a minute."""
        if self._capacity.fresh():
            return self._capacity.value
        try:
            found = capacity_of(await self._http.get(self.url + "/v1/capabilities"))
        except httpx.HTTPError:
            found = None
        return self._capacity.keep(found)

    def in_flight(self, capacity: Capacity | None) -> int:
        """Batches `score` keeps in flight: `concurrency`, within what the service serves."""
        return in_flight(capacity, self.batch_size, self.concurrency)
