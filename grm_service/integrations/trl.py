"""TRL reward functions (GRPOTrainer `reward_funcs=[...]`), sync and async.

TRL calls `fn(prompts=..., completions=..., completion_ids=..., **dataset_columns)`; prompts and
completions are strings or chat messages. A failed item gives None, which TRL ignores (NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grm_service.client import AsyncGrmClient, GrmClient
from grm_service.integrations.common import image_of, service_url, text_of
from grm_service.scoring.models import ItemResult, ScoreItem


def to_items(
    prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, Any],
    reference_key: str, image_key: str,
) -> list[ScoreItem]:
    references = columns.get(reference_key) or [None] * len(completions)
    images = columns.get(image_key) or [None] * len(completions)
    return [
        ScoreItem(id=str(i), prompt=text_of(p), completion=text_of(c),
                  reference=None if r is None else str(r), image=image_of(img))
        for i, (p, c, r, img) in enumerate(zip(prompts, completions, references, images,
                                               strict=True))
    ]


def rewards(results: Sequence[ItemResult]) -> list[float | None]:
    return [r.score if r.status == "ok" else None for r in results]


class _Base:
    def __init__(
        self, url: str | None = None, scorer: str = "judge", *, reference_key: str = "reference",
        image_key: str = "image", options: dict[str, Any] | None = None,
        sampling: dict[str, Any] | None = None, batch_size: int = 32, concurrency: int = 4,
        name: str | None = None,
    ) -> None:
        self.url, self.scorer = service_url(url), scorer
        self.reference_key, self.image_key = reference_key, image_key
        self.options, self.sampling = options or {}, sampling or {}
        self.batch_size, self.concurrency = batch_size, concurrency
        # TRL names each reward's logged column after the function's __name__.
        self.__name__ = name or f"grm_{scorer}"


class GrmReward(_Base):
    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        items = to_items(prompts, completions, kwargs, self.reference_key, self.image_key)
        with GrmClient(self.url, batch_size=self.batch_size,
                       concurrency=self.concurrency) as client:
            return rewards(client.score(items, self.scorer, sampling=self.sampling,
                                        options=self.options))


class AsyncGrmReward(_Base):
    async def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        items = to_items(prompts, completions, kwargs, self.reference_key, self.image_key)
        async with AsyncGrmClient(self.url, batch_size=self.batch_size,
                                  concurrency=self.concurrency) as client:
            return rewards(await client.score(items, self.scorer, sampling=self.sampling,
                                              options=self.options))
