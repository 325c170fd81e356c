"""Python client of `POST /v1/score`, sync and async: batching, bounded concurrency, retries.

    with GrmClient("http://127.0.0.1:8000") as client:
        results = client.score([{"id": "a", "image": data_url, "reference": "HELLO"}], "ocr")
        results[0].score, results[0].fingerprint

429/502/503/504 and connection errors are retried with exponential backoff (honouring
Retry-After); any other refusal raises `RequestRejected` at once. Item errors are not exceptions:
they come back as results with `status == "error"`. A service started with `GRM_API_KEYS` wants
`api_key=...` (sent as `Authorization: Bearer <key>`); `headers` adds any others (a proxy's).
`run=...` and `score(..., step=N)` tag the requests on the service's ledger, so that the answers
behind a training run's rewards can be found, exported and replayed by run and step.
"""

from __future__ import annotations

import asyncio
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
    attempts: int = 6
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        """Seconds before retry number `attempt` (0-based): Retry-After if given, else 2^n."""
        if retry_after:
            try:
                return min(max(float(retry_after), 0.0), self.backoff_max_s)
            except ValueError:
                pass
        return float(min(self.backoff_s * 2**attempt, self.backoff_max_s))


class _Retry(Exception):
    def __init__(self, reason: str, retry_after: str | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


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


def chunks(items: Sequence[ScoreItem], size: int) -> list[list[ScoreItem]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def request_body(
    items: Sequence[ScoreItem], scorer: str, sampling: Mapping[str, Any] | None,
    options: Mapping[str, Any] | None,
) -> dict[str, Any]:
    return {"scorer": scorer, "items": [i.to_json() for i in items],
            "sampling": dict(sampling or {}), "options": dict(options or {})}


def parse(response: httpx.Response) -> ScoreResponse:
    """The batch's answer, or _Retry / RequestRejected."""
    if response.status_code in RETRY_STATUSES:
        raise _Retry(f"HTTP {response.status_code}", response.headers.get("retry-after"))
    if response.status_code >= 400:
        try:
            message = str(response.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        raise RequestRejected(response.status_code, message)
    return ScoreResponse.from_json(response.json())


class GrmClient:
    """Blocking client; batches of one call run on `concurrency` threads."""

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
        batches = chunks(as_items(items), self.batch_size)
        with ThreadPoolExecutor(max(1, min(self.concurrency, len(batches)))) as pool:
            answers = pool.map(lambda b: self.score_batch(b, scorer, sampling, options, step),
                               batches)
            return [result for answer in answers for result in answer.results]

    def score_batch(
        self, items: Sequence[ItemLike], scorer: str,
        sampling: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
        step: int | None = None,
    ) -> ScoreResponse:
        """One `POST /v1/score`, retried while the service is busy or unreachable."""
        body = request_body(as_items(items), scorer, sampling, options)
        tags = step_headers(step)
        for attempt in range(self.retry.attempts):
            try:
                return parse(self._http.post(self.url + "/v1/score", json=body, headers=tags))
            except httpx.TransportError as err:
                reason = _Retry(repr(err))
            except _Retry as err:
                reason = err
            if attempt + 1 < self.retry.attempts:
                time.sleep(self.retry.delay(attempt, reason.retry_after))
        raise RetriesExhausted(f"gave up after {self.retry.attempts} attempts: {reason}")


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
        gate = asyncio.Semaphore(self.concurrency)

        async def one(batch: list[ScoreItem]) -> ScoreResponse:
            async with gate:
                return await self.score_batch(batch, scorer, sampling, options, step)

        batches = chunks(as_items(items), self.batch_size)
        answers = await asyncio.gather(*(one(b) for b in batches))
        return [result for answer in answers for result in answer.results]

    async def score_batch(
        self, items: Sequence[ItemLike], scorer: str,
        sampling: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
        step: int | None = None,
    ) -> ScoreResponse:
        body = request_body(as_items(items), scorer, sampling, options)
        tags = step_headers(step)
        for attempt in range(self.retry.attempts):
            try:
                return parse(await self._http.post(self.url + "/v1/score", json=body,
                                                   headers=tags))
            except httpx.TransportError as err:
                reason = _Retry(repr(err))
            except _Retry as err:
                reason = err
            if attempt + 1 < self.retry.attempts:
                await asyncio.sleep(self.retry.delay(attempt, reason.retry_after))
        raise RetriesExhausted(f"gave up after {self.retry.attempts} attempts: {reason}")
