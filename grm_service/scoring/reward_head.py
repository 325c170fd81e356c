"""A vision-language reward model with a scalar head (HPSv3's shape), on the replicas' `/classify`.

Each frame of the item (its image, or every image of a list: video frames) is sent as one user
turn, the image then the text, and the head's outputs come back raw (`use_activation: false`: no
sigmoid or softmax on them). The item's score is the mean of its frames' scores, in frame order,
as verl-omni's HPSv3 reward averages a video's frames. The engine serves the model through its
pooling runner (`*ForSequenceClassification`: a linear `score` head on the last token), so these
requests run alone on their replica unless the engine profile declares pooling batch-invariant
and the replica passed the pooling canary (`alone.pooling_alone`).

Options:

- `template` (default `"{prompt}"`): the text turn, `{prompt}` replaced by the item's prompt
  (HPSv3 reads its instruction, the prompt inside it, then its reward token; give that text here).
  The prompt is required where the template names it.
- `head` (default `"scalar"`): how the head's outputs make the score.
  `"scalar"`: the raw output at index `label`. `"hpsv3"`: HPSv3's card, two outputs (mu, sigma)
  of its uncertainty-aware ranking, the score being mu (what HPSv3's inferencer returns as the
  reward); an engine answer of another width is that item's error.
- `label` (default 0): the output index `"scalar"` reads (negative counts from the end).
- `scale` (default 1.0): a factor on each frame's score (verl-omni's `reward_scale`).

The response recorded for each frame is the list of the head's raw outputs.
"""

from __future__ import annotations

from typing import Any

from grm_service.errors import InvalidRequest
from grm_service.scoring.context import ItemError, ScorerContext
from grm_service.scoring.models import ScoreItem

PROMPT = "{prompt}"
HEADS = ("scalar", "hpsv3")
OPTIONS = ("template", "head", "label", "scale")
OPTIONS_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": {
    "template": {"type": "string", "default": PROMPT},
    "head": {"enum": list(HEADS), "default": "scalar"},
    "label": {"type": "integer", "default": 0},
    "scale": {"type": "number", "default": 1.0},
}}


def check_options(options: dict[str, Any]) -> None:
    """InvalidRequest (the whole request is wrong) for an unknown option or a wrong type."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InvalidRequest(f"reward_head options: unknown {', '.join(unknown)}; "
                             f"known: {', '.join(OPTIONS)}")
    if not isinstance(options.get("template", PROMPT), str):
        raise InvalidRequest("reward_head option template must be a string (with {prompt} "
                             "where the item's prompt goes)")
    head = options.get("head", "scalar")
    if head not in HEADS:
        raise InvalidRequest(f"reward_head option head must be one of {', '.join(HEADS)}, "
                             f"not {head!r:.40}")
    label = options.get("label", 0)
    if isinstance(label, bool) or not isinstance(label, int):
        raise InvalidRequest(f"reward_head option label must be an integer index, not "
                             f"{label!r:.40}")
    scale = options.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        raise InvalidRequest(f"reward_head option scale must be a number, not {scale!r:.40}")


def text_of(item: ScoreItem, template: str) -> str:
    if PROMPT not in template:
        return template
    if item.prompt is None:
        raise ItemError("the reward_head scorer needs the item's prompt (its template has "
                        "{prompt})")
    return template.replace(PROMPT, item.prompt)


def messages(frame: str, text: str) -> list[dict[str, Any]]:
    content = [{"type": "image_url", "image_url": {"url": frame}}, {"type": "text", "text": text}]
    return [{"role": "user", "content": content}]


def head_value(values: list[float], head: str, label: int) -> float:
    """The frame's score from the head's raw outputs, by the `head` option."""
    if head == "hpsv3":
        if len(values) != 2:
            raise ItemError(f"head hpsv3 reads two outputs (mu, sigma); the model gave "
                            f"{len(values)}")
        return values[0]
    try:
        return values[label]
    except IndexError:
        raise ItemError(f"label {label} is out of range: the model has {len(values)} "
                        "outputs") from None


async def score(item: ScoreItem, ctx: ScorerContext) -> float:
    """Mean over the item's frames of the head's value (times `scale`), in frame order."""
    check_options(ctx.options)
    frames = item.frames()
    if not frames:
        raise ItemError("the reward_head scorer needs an image")
    text = text_of(item, ctx.options.get("template", PROMPT))
    head, label = ctx.options.get("head", "scalar"), ctx.options.get("label", 0)
    scale = float(ctx.options.get("scale", 1.0))
    total = 0.0
    for frame in frames:
        values = await ctx.classify(messages(frame, text), activation=False)
        total += head_value(values, head, label) * scale
    return total / len(frames)
