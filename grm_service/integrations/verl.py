"""verl custom reward functions: `compute_score` (async, verl's reward loop) and the batch form.

verl 0.9's reward loop (`reward.reward_manager.name=naive`, the default) calls the custom function
once per sample, concurrently, and awaits it when it is a coroutine function:

    reward.custom_reward_function.path=pkg://grm_service.integrations.verl
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.url=http://127.0.0.1:8000
    +reward.custom_reward_function.reward_kwargs.scorer=judge

`pkg://` makes every Ray node import the module it has installed (a file path resolves on the
driver only). The key comes from GRM_API_KEY in the workers' environment: verl prints
`reward_kwargs` and logs them with the config, so `api_key` there is refused.

The calls of one worker that come at the same time go out as one `/v1/score` batch
(`microbatch`), over one HTTP client per event loop. The answer is a dict: `score`, and
`grm_fingerprint` (the serving identity's id) and `grm_error` (1.0 for a failed item), which verl
keeps in `reward_extra_info`. `compute_score_batch` is the form of verl's batch reward manager.
Unknown keywords are refused by Python by name (a `scorrer=` typo is a TypeError, never ignored);
`reward_router_address` and `reward_model_tokenizer`, which verl adds when it runs a reward model
of its own, are accepted and unused.

`extra_info` may carry `prompt` (or `question`) and `image` (data URL, list for frames); the
policy's text is the judged completion; the ground truth (a string, a list or a numpy array of
acceptable answers) gives the reference: its first answer, all of them in `extra["references"]`.

Group scorers: where `extra_info` carries `group_id` and `group_size` (verl_groups.py's reward
manager puts each sample's `uid` and `rollout.n` there), the item is sent with them, under an id
of its own, and the service holds it until the group's other samples have come
(docs/groups-held.md).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from grm_service.client import GrmClient
from grm_service.integrations.common import (
    KEY_ENV,
    RETRIES,
    TIMEOUT_S,
    Endpoint,
    endpoint,
    image_of,
    no_key_in_config,
    reward_or,
)
from grm_service.integrations.microbatch import WAIT_S, batcher
from grm_service.integrations.microbatch import close_clients as close_loop_clients
from grm_service.integrations.truths import references
from grm_service.wire import ItemResult, ScoreItem

# The keys of `extra_info` that name a sample's group (verl_groups.py puts them there).
GROUP_ID = "group_id"
GROUP_SIZE = "group_size"

__all__ = ["close_batch_clients", "close_clients", "compute_score", "compute_score_batch"]


# The batch form's clients, one per endpoint, shared by every thread (httpx.Client is
# thread-safe: verl's thread-pool calls share it); like the loops' clients, module state, since
# verl calls plain functions.
_BATCH_CLIENTS: dict[Endpoint, GrmClient] = {}
_BATCH_LOCK = threading.Lock()


def _sync_client(where: Endpoint) -> GrmClient:
    with _BATCH_LOCK:
        client = _BATCH_CLIENTS.get(where)
        if client is None:
            client = _BATCH_CLIENTS[where] = where.client()
        return client


def close_batch_clients() -> None:
    """Close the clients `compute_score_batch` calls share (verl never needs to: they live as
    long as its reward workers); a later call opens a new one."""
    with _BATCH_LOCK:
        clients = list(_BATCH_CLIENTS.values())
        _BATCH_CLIENTS.clear()
    for client in clients:
        client.close()


async def close_clients() -> None:
    """Close every client this module's calls share: this event loop's and the batch form's."""
    await close_loop_clients()
    close_batch_clients()


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
    group_id, group_size = extra.get(GROUP_ID), extra.get(GROUP_SIZE)
    return ScoreItem(
        id=str(index), image=image_of(extra.get("image")),
        prompt=None if prompt is None else str(prompt), completion=solution_str,
        reference=answers[0] if answers else None, extra=fields,
        group_id=None if group_id is None else str(group_id),
        group_size=None if group_size is None else int(group_size),
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
    headers: Mapping[str, str] | None = None, timeout: float = TIMEOUT_S,
    retries: int = RETRIES, batch_size: int = 32, batch_wait_s: float = WAIT_S,
    api_key_env: str = KEY_ENV, api_key: str | None = None,
    reward_router_address: str | None = None, reward_model_tokenizer: Any = None,
) -> dict[str, Any]:
    """One sample (verl's reward loop); failed items raise unless `error_score` is set."""
    no_key_in_config(api_key, "verl")
    where = endpoint(url, None, headers, batch_size, timeout=timeout, retries=retries,
                     api_key_env=api_key_env)
    item = to_item(0, data_source, solution_str, ground_truth, extra_info)
    if item.group_id:
        # One id per call: two samples of a group may be the same text, and the service takes
        # an id sent again with the same item for a retry of it.
        item = replace(item, id=uuid.uuid4().hex)
    result = await batcher(where, scorer, options, sampling, batch_wait_s).score(item)
    return reward_info(result, error_score)


def compute_score_batch(
    data_sources: Sequence[str], solution_strs: Sequence[str], ground_truths: Sequence[Any],
    extra_infos: Sequence[Mapping[str, Any] | None], *, url: str | None = None,
    scorer: str = "judge", options: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None, error_score: float | None = None,
    headers: Mapping[str, str] | None = None, batch_size: int = 32, concurrency: int = 4,
    timeout: float = TIMEOUT_S, retries: int = RETRIES, api_key_env: str = KEY_ENV,
    api_key: str | None = None,
) -> list[dict[str, Any]]:
    """verl's batch reward manager form: one reward dict per sample, in order."""
    no_key_in_config(api_key, "verl")
    rows = zip(data_sources, solution_strs, ground_truths, extra_infos, strict=True)
    items = [to_item(i, *row) for i, row in enumerate(rows)]
    client = _sync_client(endpoint(url, None, headers, batch_size, concurrency, timeout,
                                   retries, api_key_env))
    results = client.score(items, scorer, sampling=sampling, options=options)
    return [reward_info(r, error_score) for r in results]
