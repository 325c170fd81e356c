"""DisRM: a sequence-classification reward model served on the replicas' `/classify`.

The conversation is `extra["messages"]` when given, else the item's prompt and completion as a
user and an assistant turn. Options: `output` = `prob` (the last label's probability, default)
or `raw` (the last label's raw output, i.e. the reward head's value), `label` (index, default -1).

The gateway runs these requests alone on their replica unless the engine profile declares pooling
batch-invariant and the replica passed the pooling canary (see `alone.pooling_alone`).
"""

from __future__ import annotations

from typing import Any

from grm_service.errors import InvalidRequest
from grm_service.scoring.context import ItemError, ScorerContext
from grm_service.scoring.models import ScoreItem


def conversation(item: ScoreItem) -> list[dict[str, Any]]:
    given = item.extra.get("messages")
    if isinstance(given, list) and given:
        return given
    if item.completion is None:
        raise ItemError("the classify scorer needs `completion` or extra.messages")
    turns = [{"role": "user", "content": item.prompt}] if item.prompt else []
    return [*turns, {"role": "assistant", "content": item.completion}]


OPTIONS = ("output", "label")
OPTIONS_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": {
    "output": {"enum": ["prob", "raw"], "default": "prob"},
    "label": {"type": "integer", "default": -1},
}}


def check_options(options: dict[str, Any]) -> None:
    """InvalidRequest (the whole request is wrong) for an unknown option or a wrong type."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InvalidRequest(f"classify options: unknown {', '.join(unknown)}; "
                             f"known: {', '.join(OPTIONS)}")
    output = options.get("output", "prob")
    if output not in ("prob", "raw"):
        raise InvalidRequest(f"classify option output must be 'prob' or 'raw', not {output!r:.40}")
    label = options.get("label", -1)
    if isinstance(label, bool) or not isinstance(label, int):
        raise InvalidRequest(f"classify option label must be an integer index, not {label!r:.40}")


async def score(item: ScoreItem, ctx: ScorerContext) -> float:
    check_options(ctx.options)
    output = ctx.options.get("output", "prob")
    values = await ctx.classify(conversation(item), activation=output == "prob")
    label: int = ctx.options.get("label", -1)
    try:
        return values[label]
    except IndexError:
        raise ItemError(f"label {label} is out of range: the model has {len(values)}") from None
