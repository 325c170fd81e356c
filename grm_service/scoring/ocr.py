"""The GenRM OCR reward as verl-omni uses it: transcribe the image, compare with the reference.

The score is 1 - edit_distance / len(reference) on whitespace-free, lowercased text, where a
reference found inside the transcript counts as distance 0 (the model may add a caption), and the
distance is capped at the reference length so the score stays in [0, 1].
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


OPTIONS_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": False,
                                  "maxProperties": 0}


def check_options(options: dict[str, Any]) -> None:
    if options:
        raise InvalidRequest(f"the ocr scorer takes no options, got {', '.join(sorted(options))}")


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
