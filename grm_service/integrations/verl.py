"""verl `custom_reward_function`: per-sample `compute_score` and the batched form.

    custom_reward_function.path=<site-packages>/grm_service/integrations/verl.py
    custom_reward_function.name=compute_score            # or compute_score_batch with
    reward_model.reward_manager=batch                    # ... the batch reward manager
    +custom_reward_function.reward_kwargs.url=http://127.0.0.1:8000
    +custom_reward_function.reward_kwargs.scorer=judge

`extra_info` may carry `prompt` (or `question`) and `image` (data URL, list for frames); the
policy's text is the judged completion, the ground truth the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grm_service.client import GrmClient
from grm_service.integrations.common import image_of, reward_or, service_url
from grm_service.scoring.models import ScoreItem


def to_item(
    index: int, data_source: str, solution_str: str, ground_truth: Any,
    extra_info: dict[str, Any] | None,
) -> ScoreItem:
    extra = dict(extra_info or {})
    prompt = extra.get("prompt", extra.get("question"))
    return ScoreItem(
        id=str(index),
        image=image_of(extra.get("image")), prompt=None if prompt is None else str(prompt),
        completion=solution_str, reference=None if ground_truth is None else str(ground_truth),
        extra={"data_source": data_source},
    )


def compute_score_batch(
    data_sources: Sequence[str], solution_strs: Sequence[str], ground_truths: Sequence[Any],
    extra_infos: Sequence[dict[str, Any] | None], *, url: str | None = None,
    scorer: str = "judge", options: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None, error_score: float | None = None,
    batch_size: int = 32, concurrency: int = 4, **_: Any,
) -> list[float]:
    """verl's BatchRewardManager form: one reward per sample, in order."""
    items = [to_item(i, *row) for i, row in
             enumerate(zip(data_sources, solution_strs, ground_truths, extra_infos, strict=True))]
    with GrmClient(service_url(url), batch_size=batch_size, concurrency=concurrency) as client:
        results = client.score(items, scorer, sampling=sampling, options=options)
    return [reward_or(r, error_score) for r in results]


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any,
    extra_info: dict[str, Any] | None = None, **kwargs: Any,
) -> float:
    """verl's per-sample form (NaiveRewardManager)."""
    return compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info],
                               **kwargs)[0]
