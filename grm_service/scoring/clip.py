"""`clip`: a dual encoder's image-text score (PickScore, HPSv2: CLIP; SigLIP), from its embeddings.

The engine embeds the item's image (`/v1/embeddings`, one chat message with the image) and its
prompt (`/v1/embeddings`, `input`); the score is the model's own logit:

- CLIPModel: `exp(logit_scale) * cos(image, text)` (CLIP's `logits_per_image`, PickScore);
- SiglipModel: `exp(logit_scale) * cos(image, text) + logit_bias` (SigLIP's `logits_per_image`,
  before its sigmoid),

with `logit_scale` and `logit_bias` read from the served checkpoint at start-up
(`dual_scales.py`), never the config's initial value. The cosine is computed in float64 over the
engine's float32 values, each sum by `math.fsum` (exactly rounded, so independent of order): the
score's bits are a function of the two embeddings' bits alone.

Options: `output`: `logit` (default, the above: PickScore's score) or `cosine` (the cosine
alone: HPSv2's score, `image_features @ text_features.T` of unit vectors); `softmax` (default
false): PickScore's probabilities, a softmax of the logits over each
group: the items sharing a `group_id`, or the whole request where none has one. A group's items
must all come in the request; they are taken in the order of their content digests, and a group
with a failed item fails as a whole (a softmax over the others would mean another thing).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from grm_service.dual_scales import DualScales
from grm_service.errors import InvalidRequest
from grm_service.fingerprint import json_digest
from grm_service.scoring.context import ItemError, ScorerContext
from grm_service.scoring.models import ItemResult, ScoreItem

OPTIONS = ("output", "softmax")
OPTIONS_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": {
    "output": {"enum": ["logit", "cosine"], "default": "logit"},
    "softmax": {"type": "boolean", "default": False},
}}
MAX_SOFTMAX_GROUP = 4096


def check_options(options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InvalidRequest(f"clip options: unknown {', '.join(unknown)}; known: "
                             f"{', '.join(OPTIONS)}")
    if not isinstance(options.get("softmax", False), bool):
        raise InvalidRequest("clip option softmax must be true or false")
    output = options.get("output", "logit")
    if output not in ("logit", "cosine"):
        raise InvalidRequest(f"clip option output must be 'logit' or 'cosine', not {output!r:.40}")


def check_items(items: list[ScoreItem], options: dict[str, Any]) -> None:
    """An image and a prompt each; with softmax, every group whole in this request."""
    for item in items:
        if not isinstance(item.image, str) or not item.prompt:
            raise InvalidRequest(f"the clip scorer needs one image and a prompt per item; item "
                                 f"{item.id!r:.40} has {_has(item)}")
    if not options.get("softmax"):
        return
    for group, members in groups(items).items():
        if len(members) > MAX_SOFTMAX_GROUP:
            raise InvalidRequest(f"clip softmax group {group!r:.40} has {len(members)} items; "
                                 f"at most {MAX_SOFTMAX_GROUP}")
        sizes = {m.group_size for m in members if m.group_size is not None}
        if sizes - {len(members)}:
            raise InvalidRequest(
                f"clip softmax: group {group!r:.40} says group_size {min(sizes - {len(members)})}"
                f" but this request has {len(members)} of its items; a softmax needs the whole "
                "group in one request")


def _has(item: ScoreItem) -> str:
    image = "no image" if item.image is None else (
        "a list of images" if isinstance(item.image, list) else "an image")
    return f"{image} and {'a prompt' if item.prompt else 'no prompt'}"


def groups(items: Sequence[ScoreItem]) -> dict[str | None, list[ScoreItem]]:
    """Items by group_id; None: those without one (one group: the request)."""
    found: dict[str | None, list[ScoreItem]] = defaultdict(list)
    for item in items:
        found[item.group_id].append(item)
    return found


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """cos(a, b) in float64, every sum exactly rounded (math.fsum): no order, no fused ops."""
    if len(a) != len(b) or not a:
        raise ItemError(f"the image and text embeddings differ in size ({len(a)}, {len(b)})")
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    if norms == 0.0:
        raise ItemError("an embedding is all zeros: no cosine")
    return dot / norms


def logit(scales: DualScales, image: Sequence[float], text: Sequence[float]) -> float:
    """The model's own logit: see the module docstring."""
    value = math.exp(scales.logit_scale) * cosine(image, text)
    return value + scales.logit_bias if scales.logit_bias is not None else value


async def score(item: ScoreItem, ctx: ScorerContext) -> float:
    if ctx.scales is None:
        raise ItemError("the clip scorer needs a CLIP or SigLIP checkpoint's logit_scale, and "
                        "the served model has none here: serve one with --model its folder")
    if not isinstance(item.image, str) or not item.prompt:
        raise ItemError("the clip scorer needs one image and a prompt")
    image = await ctx.embed({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": item.image}}]}]})
    text = await ctx.embed({"input": item.prompt})
    if ctx.options.get("output") == "cosine":
        return cosine(image, text)
    return logit(ctx.scales, image, text)


def softmax(values: Sequence[float]) -> list[float]:
    """exp(v - max) / fsum(exp(...)), in float64: the same bits whatever the input order."""
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    total = math.fsum(exps)
    return [e / total for e in exps]


def content_digest(item: ScoreItem) -> str:
    return json_digest({"image": item.image, "prompt": item.prompt})


def finish(items: Sequence[ScoreItem], results: list[ItemResult],
           options: dict[str, Any]) -> list[ItemResult]:
    """With `softmax`, each group's logits become its probabilities (see the docstring)."""
    if not options.get("softmax"):
        return results
    by_id = {r.id: r for r in results}
    for members in groups(items).values():
        ordered = sorted(members, key=lambda m: (content_digest(m), m.id))
        failed = [m.id for m in ordered if by_id[m.id].score is None]
        if failed:
            for m in ordered:
                by_id[m.id] = _failed(by_id[m.id], failed[0])
            continue
        probs = softmax([float(by_id[m.id].score or 0.0) for m in ordered])
        for m, p in zip(ordered, probs, strict=True):
            by_id[m.id] = by_id[m.id].model_copy(update={"score": p})
    return [by_id[r.id] for r in results]


def _failed(result: ItemResult, first: str) -> ItemResult:
    if result.status == "error":
        return result
    return result.model_copy(update={
        "score": None, "status": "error",
        "error": f"clip softmax: item {first!r:.40} of this group failed, so the group has "
                 "no probabilities"})
