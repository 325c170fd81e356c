"""TRL reward functions (GRPOTrainer `reward_funcs=[...]`), sync and async.

    from grm_service.integrations.trl import grm_reward, async_grm_reward
    GRPOTrainer(..., reward_funcs=[async_grm_reward("http://127.0.0.1:8000", scorer="judge")])

An image generator's reward (`grm_image_reward`, `async_grm_image_reward`) takes the same call:
each completion is a generated image, scored against its prompt (`clip`, `reward_head`).

TRL calls `fn(prompts=..., completions=..., completion_ids=..., **dataset_columns)`; prompts and
completions are strings or chat messages. Both factories return callable class instances
(`GrmReward`, `AsyncGrmReward`, whose `__call__` is `async def`): they pickle, as TRL 1.16's
`AsyncGRPOTrainer` needs (it sends `reward_funcs` to a spawned process), and carry `__name__`
for TRL's logged reward column. A failed item gives None, TRL's "no reward" (NaN in its metrics),
and a warning with the reason. Where TRL passes `log_extra` and `log_metric` (GRPOTrainer), each
completion's fingerprint id and error go to the completions table (`<name>/grm_fingerprint`,
`<name>/grm_error`) and the batch's error rate to the metrics (`<name>/grm_error_rate`).

Group rewards (`pairwise`, `listwise`: the completions of one prompt judged together):

    GRPOTrainer(..., reward_funcs=[group_reward(url, "pairwise", num_generations=8)])

Each completion gets a `group_id` from its prompt (text and images), the trainer's step, and
which of that prompt's groups in this call it is (a prompt sampled twice in a batch is two
groups of `num_generations`); `group_size` is `num_generations` where given, else the count of
the prompt's completions in the call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from grm_service.integrations.common import (
    KEY_ENV,
    RETRIES,
    TIMEOUT_S,
    Endpoint,
    ScoringError,
    endpoint,
    image_of,
    step_of,
    text_of,
)
from grm_service.integrations.truths import references
from grm_service.wire import ItemResult, ScoreItem

log = logging.getLogger(__name__)

# Dataset columns TRL passes images in: its preferred `images` (a list per row), then `image`.
IMAGE_COLUMNS = ("images", "image")

# What TRL passes besides the dataset's columns; never sent as item data.
TRAINER_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments")


@dataclass(frozen=True)
class Job:
    """What one reward function asks of the service, besides where it is."""

    scorer: str
    reference_key: str = "reference"
    image_key: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    grouped: bool = False  # give every item its prompt's group_id and group_size
    num_generations: int | None = None
    generated_images: bool = False  # the completions are images, scored against the prompt


def prompt_images(prompt: Any) -> list[Any]:
    """Images inside a conversational prompt's content parts (`{"type": "image", "image": ...}`
    as TRL builds them, or OpenAI's `image_url`)."""
    if not isinstance(prompt, list):
        return []
    found: list[Any] = []
    for message in prompt:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "image" and part.get("image") is not None:
                found.append(part["image"])
            elif part.get("type") == "image_url":
                url = part.get("image_url")
                found.append(url.get("url") if isinstance(url, dict) else url)
    return found


def images_for(columns: Mapping[str, Any], prompts: Sequence[Any], job: Job) -> list[Any]:
    """Each row's image(s): the named column, else TRL's image columns, else the prompt's."""
    keys = (job.image_key,) if job.image_key else IMAGE_COLUMNS
    for key in keys:
        column = columns.get(key)
        if column is not None:
            return list(column)
    return [prompt_images(p) or None for p in prompts]


def image_items(
    prompts: Sequence[Any], completions: Sequence[Any], columns: Mapping[str, Any], job: Job,
) -> list[ScoreItem]:
    """An image generator's samples: each generated image (the completion, or the `image_key`
    column) with its prompt's text, for the scorers of an image against its prompt."""
    images = list(columns[job.image_key]) if job.image_key else list(completions)
    return [ScoreItem(id=str(i), prompt=text_of(p), image=image_of(img))
            for i, (p, img) in enumerate(zip(prompts, images, strict=True))]


def to_items(
    prompts: Sequence[Any], completions: Sequence[Any], columns: Mapping[str, Any], job: Job,
) -> list[ScoreItem]:
    if job.generated_images:
        return image_items(prompts, completions, columns, job)
    n = len(completions)
    refs = columns.get(job.reference_key) or [None] * n
    images = images_for(columns, prompts, job)
    items = []
    for i, (p, c, r, img) in enumerate(zip(prompts, completions, refs, images, strict=True)):
        answers = references(r)
        extra = {"references": answers} if len(answers) > 1 else {}
        items.append(ScoreItem(id=str(i), prompt=text_of(p), completion=text_of(c),
                               reference=answers[0] if answers else None,
                               image=image_of(img), extra=extra))
    return items


def with_groups(items: list[ScoreItem], step: int | None, size: int | None
                ) -> list[ScoreItem]:
    """The items with their group: the j-th completion of a prompt (its text and images) is in
    its `j // size`-th group of this call; `size` None: all of the prompt's completions."""
    keys = [_digest([item.prompt or "", item.image]) for item in items]
    seen: dict[str, int] = {}
    ordinal = []
    for key in keys:
        ordinal.append(seen.get(key, 0))
        seen[key] = ordinal[-1] + 1
    out = []
    for item, key, j in zip(items, keys, ordinal, strict=True):
        k = j // size if size else 0
        members = size or seen[key]
        group_id = _digest({"prompt": key, "step": step, "group": k})
        out.append(dataclasses.replace(item, group_id=group_id, group_size=members))
    return out


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def rewards(results: Sequence[ItemResult], name: str) -> list[float | None]:
    """Scores in order; None (TRL: no reward for this sample) for a failed item, logged."""
    out: list[float | None] = []
    for r in results:
        if r.status == "ok" and r.score is not None:
            out.append(r.score)
        else:
            log.warning("%s: sample %s has no reward: %s", name, r.id, r.error)
            out.append(None)
    return out


def report(results: Sequence[ItemResult], name: str, hooks: Mapping[str, Any]) -> None:
    """Fingerprints and errors through TRL's `log_extra` / `log_metric`, where it gives them."""
    log_extra: Callable[[str, list[Any]], None] | None = hooks.get("log_extra")
    log_metric: Callable[[str, float], None] | None = hooks.get("log_metric")
    if log_extra is not None:
        log_extra(f"{name}/grm_fingerprint",
                  [r.fingerprint.fingerprint_id if r.fingerprint else "" for r in results])
        log_extra(f"{name}/grm_error", [r.error or "" for r in results])
    if log_metric is not None and results:
        log_metric(f"{name}/grm_error_rate",
                   sum(r.status == "error" for r in results) / len(results))


@dataclass
class _Reward:
    job: Job
    where: Endpoint
    __name__: str

    def _items(self, prompts: Sequence[Any], completions: Sequence[Any],
               columns: dict[str, Any]) -> tuple[list[ScoreItem], dict[str, Any]]:
        hooks = {k: columns.pop(k) for k in TRAINER_KWARGS if k in columns}
        items = to_items(prompts, completions, columns, self.job)
        if self.job.grouped:
            items = with_groups(items, step_of(hooks), self.job.num_generations)
        return items, hooks


class GrmReward(_Reward):
    """A synchronous TRL reward function (picklable)."""

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 **columns: Any) -> list[float | None]:
        items, hooks = self._items(prompts, completions, columns)
        # A client per call, closed after it: one call is a whole generation batch.
        with self.where.client() as client:
            results = client.score(items, self.job.scorer, sampling=self.job.sampling,
                                   options=self.job.options, step=step_of(hooks))
        report(results, self.__name__, hooks)
        return rewards(results, self.__name__)


class AsyncGrmReward(_Reward):
    """An `async` TRL reward function (picklable; TRL runs those concurrently)."""

    async def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                       **columns: Any) -> list[float | None]:
        items, hooks = self._items(prompts, completions, columns)
        # A client per call: TRL may run reward functions on a loop of its own, and an async
        # client belongs to the loop it first ran on; one call is a whole batch anyway.
        async with self.where.async_client() as client:
            results = await client.score(items, self.job.scorer, sampling=self.job.sampling,
                                         options=self.job.options, step=step_of(hooks))
        report(results, self.__name__, hooks)
        return rewards(results, self.__name__)


def _parts(
    url: str | None, scorer: str, reference_key: str, image_key: str | None,
    options: dict[str, Any] | None, sampling: dict[str, Any] | None, api_key: str | None,
    headers: Mapping[str, str] | None, batch_size: int, concurrency: int, timeout: float,
    retries: int, api_key_env: str,
) -> tuple[Job, Endpoint]:
    job = Job(scorer, reference_key, image_key, dict(options or {}), dict(sampling or {}))
    return job, endpoint(url, api_key, headers, batch_size, concurrency, timeout, retries,
                         api_key_env)


def grm_reward(
    url: str | None = None, scorer: str = "judge", *, reference_key: str = "reference",
    image_key: str | None = None, options: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None, api_key: str | None = None,
    headers: Mapping[str, str] | None = None, batch_size: int = 32, concurrency: int = 4,
    timeout: float = TIMEOUT_S, retries: int = RETRIES, api_key_env: str = KEY_ENV,
    name: str | None = None,
) -> GrmReward:
    """A synchronous TRL reward function."""
    job, where = _parts(url, scorer, reference_key, image_key, options, sampling, api_key,
                        headers, batch_size, concurrency, timeout, retries, api_key_env)
    return GrmReward(job, where, name or f"grm_{scorer}")


def async_grm_reward(
    url: str | None = None, scorer: str = "judge", *, reference_key: str = "reference",
    image_key: str | None = None, options: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None, api_key: str | None = None,
    headers: Mapping[str, str] | None = None, batch_size: int = 32, concurrency: int = 4,
    timeout: float = TIMEOUT_S, retries: int = RETRIES, api_key_env: str = KEY_ENV,
    name: str | None = None,
) -> AsyncGrmReward:
    """An `async` TRL reward function (TRL runs those concurrently with each other)."""
    job, where = _parts(url, scorer, reference_key, image_key, options, sampling, api_key,
                        headers, batch_size, concurrency, timeout, retries, api_key_env)
    return AsyncGrmReward(job, where, name or f"grm_{scorer}")


def group_reward(
    url: str | None = None, scorer: str = "pairwise", *, num_generations: int | None = None,
    reference_key: str = "reference", image_key: str | None = None,
    options: dict[str, Any] | None = None, sampling: dict[str, Any] | None = None,
    api_key: str | None = None, headers: Mapping[str, str] | None = None,
    batch_size: int = 64, concurrency: int = 4, timeout: float = TIMEOUT_S,
    retries: int = RETRIES, api_key_env: str = KEY_ENV, name: str | None = None,
) -> GrmReward:
    """A synchronous TRL reward function that judges each prompt's completions together
    (`num_generations`: GRPOConfig's; None: the prompt's completions in each call)."""
    job, where = _parts(url, scorer, reference_key, image_key, options, sampling, api_key,
                        headers, batch_size, concurrency, timeout, retries, api_key_env)
    return GrmReward(_grouped(job, num_generations), where, name or f"grm_{scorer}")


def async_group_reward(
    url: str | None = None, scorer: str = "pairwise", *, num_generations: int | None = None,
    reference_key: str = "reference", image_key: str | None = None,
    options: dict[str, Any] | None = None, sampling: dict[str, Any] | None = None,
    api_key: str | None = None, headers: Mapping[str, str] | None = None,
    batch_size: int = 64, concurrency: int = 4, timeout: float = TIMEOUT_S,
    retries: int = RETRIES, api_key_env: str = KEY_ENV, name: str | None = None,
) -> AsyncGrmReward:
    """`group_reward`, `async` (TRL runs those concurrently with each other)."""
    job, where = _parts(url, scorer, reference_key, image_key, options, sampling, api_key,
                        headers, batch_size, concurrency, timeout, retries, api_key_env)
    return AsyncGrmReward(_grouped(job, num_generations), where, name or f"grm_{scorer}")


def _grouped(job: Job, num_generations: int | None) -> Job:
    if num_generations is not None and (isinstance(num_generations, bool) or not isinstance(
            num_generations, int) or num_generations < 1):
        raise ScoringError(f"num_generations must be a whole number >= 1, not "
                           f"{num_generations!r}")
    return Job(job.scorer, job.reference_key, job.image_key, job.options, job.sampling,
               grouped=True, num_generations=num_generations)


def grm_image_reward(
    url: str | None = None, scorer: str = "clip", *, image_key: str | None = None,
    options: dict[str, Any] | None = None, api_key: str | None = None,
    headers: Mapping[str, str] | None = None, batch_size: int = 32, concurrency: int = 4,
    timeout: float = TIMEOUT_S, retries: int = RETRIES, api_key_env: str = KEY_ENV,
    name: str | None = None,
) -> GrmReward:
    """A synchronous TRL reward function for an image generator: each completion is a generated
    image (a PIL image, encoded bytes or a data URL; or the `image_key` column's), scored by
    `scorer` (`clip`, `reward_head`) against its prompt's text."""
    job, where = _parts(url, scorer, "reference", image_key, options, None, api_key, headers,
                        batch_size, concurrency, timeout, retries, api_key_env)
    return GrmReward(replace(job, generated_images=True), where, name or f"grm_{scorer}")


def async_grm_image_reward(
    url: str | None = None, scorer: str = "clip", *, image_key: str | None = None,
    options: dict[str, Any] | None = None, api_key: str | None = None,
    headers: Mapping[str, str] | None = None, batch_size: int = 32, concurrency: int = 4,
    timeout: float = TIMEOUT_S, retries: int = RETRIES, api_key_env: str = KEY_ENV,
    name: str | None = None,
) -> AsyncGrmReward:
    """`grm_image_reward`, `async` (TRL runs those concurrently with each other)."""
    job, where = _parts(url, scorer, "reference", image_key, options, None, api_key, headers,
                        batch_size, concurrency, timeout, retries, api_key_env)
    return AsyncGrmReward(replace(job, generated_images=True), where, name or f"grm_{scorer}")
