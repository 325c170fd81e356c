"""OpenRLHF's remote reward protocol (`--remote_rm_url`, `--reward.remote_url`).

OpenRLHF POSTs `{"query": [...], "prompts": [...], "labels": [...]}`, where each query is the
prompt followed by the policy's response, and reads `{"rewards", "scores", "extra_logs"}`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from grm_service.integrations.common import reward_or
from grm_service.scoring.models import ItemResult, ScoreItem


class RewardRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    query: list[str] = Field(min_length=1)
    prompts: list[str] | None = None
    labels: list[Any] | None = None


def completion_of(query: str, prompt: str | None) -> str:
    """The response part of a query (OpenRLHF sends prompt + response as one string)."""
    if prompt and query.startswith(prompt):
        return query[len(prompt):]
    return query


def to_items(req: RewardRequest) -> list[ScoreItem]:
    n = len(req.query)
    prompts: Sequence[str | None] = req.prompts if req.prompts else [None] * n
    labels: Sequence[Any] = req.labels if req.labels else [None] * n
    if len(prompts) != n or len(labels) != n:
        raise ValueError(f"query, prompts and labels differ in length ({n}, "
                         f"{len(prompts)}, {len(labels)})")
    return [ScoreItem(id=str(i), prompt=p, completion=completion_of(q, p),
                      reference=None if label is None else str(label))
            for i, (q, p, label) in enumerate(zip(req.query, prompts, labels, strict=True))]


def to_response(results: Sequence[ItemResult], error_reward: float | None) -> dict[str, Any]:
    """Rewards in order; `extra_logs` carries per-sample error flags and fingerprint digests."""
    values = [reward_or(r, error_reward) for r in results]
    return {
        "rewards": values,
        "scores": values,
        "extra_logs": {"grm_error": [float(r.status == "error") for r in results]},
        "grm_fingerprints": [r.fingerprint.model_dump() if r.fingerprint else None
                             for r in results],
    }
