"""verl custom reward functions: `compute_score` (async, verl's reward loop) and the batch form.

verl 0.9's reward loop (`reward.reward_manager.name=naive`, the default) calls the custom function
once per sample, concurrently, and awaits it when it is a coroutine function:

    reward.custom_reward_function.path=<site-packages>/grm_service/integrations/verl.py
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.url=http://127.0.0.1:8000
    +reward.custom_reward_function.reward_kwargs.scorer=judge

Every call in a process shares one HTTP client (per event loop), so a batch of samples costs
one connection pool, not one per sample. The answer is a dict: `score`, and `grm_fingerprint`
(the serving identity's id) and `grm_error` (1.0 for a failed item), which verl keeps in
`reward_extra_info`. `compute_score_batch` is the form of verl's batch reward manager.

`extra_info` may carry `prompt` (or `question`) and `image` (data URL, list for frames); the
policy's text is the judged completion; the ground truth (a string, a list or a numpy array of
acceptable answers) gives the reference: its first answer, all of them in `extra["references"]`.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from grm_service.client import AsyncGrmClient, GrmClient
from grm_service.integrations.common import Endpoint, endpoint, image_of, references, reward_or
from grm_service.scoring.models import ItemResult, ScoreItem

# verl imports this file by path and calls a plain function per sample: a client can only be
# shared through module state. Keyed by event loop, because an async client is bound to its loop.
_ASYNC_CLIENTS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[Endpoint, AsyncGrmClient]
] = weakref.WeakKeyDictionary()


@functools.cache
def _sync_client(where: Endpoint) -> GrmClient:
    return where.client()  # httpx.Client is thread-safe: verl's thread-pool calls share it


def _async_client(where: Endpoint) -> AsyncGrmClient:
    per_loop = _ASYNC_CLIENTS.setdefault(asyncio.get_running_loop(), {})
    if where not in per_loop:
        per_loop[where] = where.async_client()
    return per_loop[where]


async def close_clients() -> None:
    """Close the clients this event loop's calls share (verl itself never needs to: they live
    as long as its reward workers)."""
    for client in _ASYNC_CLIENTS.pop(asyncio.get_running_loop(), {}).values():
        await client.aclose()


def to_item(
    index: int, data_source: str, solution_str: str, ground_truth: Any,
    extra_info: Mapping[str, Any] | None,
) -> ScoreItem:
    extra = dict(extra_info or {})
    prompt = extra.get("prompt", extra.get("question"))
    answers = references(ground_truth)
    fields: dict[str, Any] = {"data_source": str(data_source)}
    if len(answers) > 1:
        fields["references"] = answers
    return ScoreItem(
        id=str(index), image=image_of(extra.get("image")),
        prompt=None if prompt is None else str(prompt), completion=solution_str,
        reference=answers[0] if answers else None, extra=fields,
    )


def reward_info(result: ItemResult, error_score: float | None) -> dict[str, Any]:
    """verl's dict form: `score` is the reward, the other keys land in reward_extra_info."""
    fingerprint = result.fingerprint.fingerprint_id if result.fingerprint else ""
    return {"score": reward_or(result, error_score), "grm_fingerprint": fingerprint,
            "grm_error": float(result.status == "error")}


async def compute_score(
    data_source: str, solution_str: str, ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None, *, url: str | None = None,
    scorer: str = "judge", options: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None, error_score: float | None = None,
    api_key: str | None = None, headers: Mapping[str, str] | None = None, **_: Any,
) -> dict[str, Any]:
    """One sample (verl's reward loop); failed items raise unless `error_score` is set."""
    client = _async_client(endpoint(url, api_key, headers))
    item = to_item(0, data_source, solution_str, ground_truth, extra_info)
    answer = await client.score_batch([item], scorer, sampling=sampling, options=options)
    return reward_info(answer.results[0], error_score)


def compute_score_batch(
    data_sources: Sequence[str], solution_strs: Sequence[str], ground_truths: Sequence[Any],
    extra_infos: Sequence[Mapping[str, Any] | None], *, url: str | None = None,
    scorer: str = "judge", options: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None, error_score: float | None = None,
    api_key: str | None = None, headers: Mapping[str, str] | None = None,
    batch_size: int = 32, concurrency: int = 4, **_: Any,
) -> list[dict[str, Any]]:
    """verl's batch reward manager form: one reward dict per sample, in order."""
    rows = zip(data_sources, solution_strs, ground_truths, extra_infos, strict=True)
    items = [to_item(i, *row) for i, row in enumerate(rows)]
    client = _sync_client(endpoint(url, api_key, headers, batch_size, concurrency))
    results = client.score(items, scorer, sampling=sampling, options=options)
    return [reward_info(r, error_score) for r in results]
