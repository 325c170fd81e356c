"""TRL reward functions (GRPOTrainer `reward_funcs=[...]`), sync and async.

    from grm_service.integrations.trl import grm_reward, async_grm_reward
    GRPOTrainer(..., reward_funcs=[async_grm_reward("http://127.0.0.1:8000", scorer="judge")])

TRL calls `fn(prompts=..., completions=..., completion_ids=..., **dataset_columns)`; prompts and
completions are strings or chat messages. Both factories return plain functions (`async def` for
the async one), the forms every TRL release recognises, named for TRL's logged reward column. A
failed item gives None, TRL's "no reward" (NaN in its metrics), and a warning with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from grm_service.integrations.common import (
    Endpoint,
    endpoint,
    image_of,
    references,
    text_of,
)
from grm_service.scoring.models import ItemResult, ScoreItem

log = logging.getLogger(__name__)

# Dataset columns TRL passes images in: its preferred `images` (a list per row), then `image`.
IMAGE_COLUMNS = ("images", "image")

RewardFn = Callable[..., list[float | None]]
AsyncRewardFn = Callable[..., Awaitable[list[float | None]]]


@dataclass(frozen=True)
class Job:
    """What one reward function asks of the service, besides where it is."""

    scorer: str
    reference_key: str = "reference"
    image_key: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)


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


def to_items(
    prompts: Sequence[Any], completions: Sequence[Any], columns: Mapping[str, Any], job: Job,
) -> list[ScoreItem]:
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


def grm_reward(
    url: str | None = None, scorer: str = "judge", *, reference_key: str = "reference",
    image_key: str | None = None, options: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None, api_key: str | None = None,
    headers: Mapping[str, str] | None = None, batch_size: int = 32, concurrency: int = 4,
    name: str | None = None,
) -> RewardFn:
    """A synchronous TRL reward function."""
    job = Job(scorer, reference_key, image_key, dict(options or {}), dict(sampling or {}))
    where = endpoint(url, api_key, headers, batch_size, concurrency)

    def reward(prompts: Sequence[Any], completions: Sequence[Any],
               **columns: Any) -> list[float | None]:
        items = to_items(prompts, completions, columns, job)
        # A client per call, closed after it: one call is a whole generation batch.
        with where.client() as client:
            results = client.score(items, job.scorer, sampling=job.sampling,
                                   options=job.options)
        return rewards(results, reward.__name__)

    reward.__name__ = reward.__qualname__ = name or f"grm_{scorer}"
    return reward


def async_grm_reward(
    url: str | None = None, scorer: str = "judge", *, reference_key: str = "reference",
    image_key: str | None = None, options: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None, api_key: str | None = None,
    headers: Mapping[str, str] | None = None, batch_size: int = 32, concurrency: int = 4,
    name: str | None = None,
) -> AsyncRewardFn:
    """An `async def` TRL reward function (TRL runs those concurrently with each other)."""
    job = Job(scorer, reference_key, image_key, dict(options or {}), dict(sampling or {}))
    where: Endpoint = endpoint(url, api_key, headers, batch_size, concurrency)

    async def reward(prompts: Sequence[Any], completions: Sequence[Any],
                     **columns: Any) -> list[float | None]:
        items = to_items(prompts, completions, columns, job)
        # A client per call: TRL may run reward functions on a loop of its own, and an async
        # client belongs to the loop it first ran on; one call is a whole batch anyway.
        async with where.async_client() as client:
            results = await client.score(items, job.scorer, sampling=job.sampling,
                                         options=job.options)
        return rewards(results, reward.__name__)

    reward.__name__ = reward.__qualname__ = name or f"grm_{scorer}"
    return reward
