"""The GenRM OCR reward as verl-omni uses it: transcribe the image, compare with the reference.

The score is 1 - edit_distance / len(reference) on whitespace-free, lowercased text, where a
reference found inside the transcript counts as distance 0 (the model may add a caption), and the
distance is capped at the reference length so the score stays in [0, 1].

It reads the item's image, never its `completion`: a text policy's answer scored with `ocr` would
get the reward of its prompt's image, the same for every answer. A request whose items carry a
completion is refused (the `judge` scorer reads it) unless its options say
`ignore_completion: true`, i.e. the completion is known not to be the thing scored.
"""

from __future__ import annotations

import re
from typing import Any

from rapidfuzz.distance import Levenshtein

from grm_service.errors import InvalidRequest
from grm_service.scoring.context import ItemError, ScorerContext
from grm_service.scoring.models import ScoreItem

SYSTEM = "You are a helpful assistant."
INSTRUCTION = (
    "Please output only the text content from the image without any additional descriptions "
    "or formatting."
)
SAMPLING = {"temperature": 0.7, "top_p": 0.8, "max_tokens": 4096}
_SPACE = re.compile(r"\s+")


def normalize(text: str) -> str:
    return _SPACE.sub("", text).lower()


def ocr_score(transcript: str, reference: str) -> float:
    """The OCR reward in [0, 1]; see the module docstring."""
    hyp, ref = normalize(transcript), normalize(reference)
    if not ref:
        return 1.0 if not hyp else 0.0
    distance = 0 if ref in hyp else min(int(Levenshtein.distance(hyp, ref)), len(ref))
    return 1.0 - distance / len(ref)


def messages(image: str) -> list[dict[str, object]]:
    content = [{"type": "image_url", "image_url": {"url": image}},
               {"type": "text", "text": INSTRUCTION}]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]


OPTIONS = ("ignore_completion",)
OPTIONS_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": {
    "ignore_completion": {"type": "boolean", "default": False},
}}


def check_options(options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InvalidRequest(f"ocr options: unknown {', '.join(unknown)}; known: "
                             f"{', '.join(OPTIONS)}")
    if not isinstance(options.get("ignore_completion", False), bool):
        raise InvalidRequest("ocr option ignore_completion must be true or false")


def check_items(items: list[ScoreItem], options: dict[str, Any]) -> None:
    """A text policy's completion is not what `ocr` scores: refuse rather than score the image."""
    if options.get("ignore_completion"):
        return
    texts = [item.id for item in items if item.completion]
    if texts:
        raise InvalidRequest(
            f"the ocr scorer scores an item's image against its reference and ignores its "
            f"completion, yet {len(texts)} item(s) carry one (first: {texts[0]!r:.40}): each "
            "answer would get its prompt's image's reward. Score a text policy's answers with "
            "the judge scorer (or a judge preset); if the completion is really not the thing "
            "scored, set options.ignore_completion=true")


async def score(item: ScoreItem, ctx: ScorerContext) -> float:
    """Mean OCR reward over the item's frames (one request per frame)."""
    frames = item.frames()
    if not frames:
        raise ItemError("the ocr scorer needs an image")
    if item.reference is None:
        raise ItemError("the ocr scorer needs a reference text")
    scores = [ocr_score(await ctx.chat(messages(frame), **SAMPLING), item.reference)
              for frame in frames]
    return sum(scores) / len(scores)
