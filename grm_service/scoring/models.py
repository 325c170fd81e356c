"""The records of `POST /v1/score`: items in, results and a batch fingerprint out."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from grm_service.fingerprint import Fingerprint


class ScoreItem(BaseModel):
    """One thing to score. `image` is a data URL or bare base64; a list of them is video frames."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    image: str | list[str] | None = None
    prompt: str | None = None
    completion: str | None = Field(
        default=None, description="The text judged (e.g. a policy's answer): judge, classify."
    )
    reference: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)
    group_id: str | None = Field(
        default=None, min_length=1, max_length=256,
        description="Group scorers: items with the same group_id are judged together, "
                    "whichever requests bring them.",
    )
    group_size: int | None = Field(
        default=None, ge=1,
        description="Group scorers: how many items the group has; the service holds the "
                    "group's items until all have come.",
    )

    def frames(self) -> list[str]:
        if self.image is None:
            return []
        return [self.image] if isinstance(self.image, str) else list(self.image)


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scorer: str = Field(min_length=1)
    items: list[ScoreItem] = Field(min_length=1)
    sampling: dict[str, Any] = Field(
        default_factory=dict, description="Overrides of the scorer's sampling (temperature...)."
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Scorer options (judge pattern and range...)."
    )

    @field_validator("items")
    @classmethod
    def _unique_ids(cls, items: list[ScoreItem]) -> list[ScoreItem]:
        seen: set[str] = set()
        for item in items:
            if item.id in seen:
                raise ValueError(f"item id {item.id!r} appears twice; ids must be unique")
            seen.add(item.id)
        return items


class ItemResult(BaseModel):
    id: str
    score: float | None
    status: Literal["ok", "error"]
    error: str | None = None
    response: str | list[str] | None = None
    fingerprint: Fingerprint | None = None
    digest: str = Field(description="Digest of id, status, score and the fingerprint digests.")


class BatchFingerprint(BaseModel):
    fingerprint_id: str
    scorer: str
    items: int
    errors: int
    digest: str = Field(description="Digest over the item digests, in input order.")


class ScoreResponse(BaseModel):
    results: list[ItemResult]
    fingerprint: BatchFingerprint
