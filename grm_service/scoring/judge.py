"""An LLM judge: a prompt asks for a numeric score, a regex reads it, the range normalises it.

Options (request `options`): `template` (str.format fields: prompt, completion, reference, min,
max), `pattern` (a regex whose first group is the number; the last match wins, as judges tend to
restate their verdict at the end), `min` and `max` (the scale, mapped onto [0, 1]).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from grm_service.scoring.context import ItemError, ScorerContext
from grm_service.scoring.models import ScoreItem

TEMPLATE = (
    "You are a strict grader. Rate the response to the task on a scale from {min} to {max}.\n\n"
    "Task:\n{prompt}\n\nReference answer (may be empty):\n{reference}\n\n"
    "Response:\n{completion}\n\nEnd your reply with a line 'Score: <number>'."
)
PATTERN = r"(?i)score\s*[:=]\s*(-?\d+(?:\.\d+)?)"
SAMPLING = {"temperature": 0.0, "max_tokens": 512}


@dataclass(frozen=True)
class JudgeOptions:
    template: str = TEMPLATE
    pattern: str = PATTERN
    low: float = 1.0
    high: float = 10.0

    @classmethod
    def parse(cls, options: dict[str, Any]) -> JudgeOptions:
        try:
            opts = cls(template=str(options.get("template", TEMPLATE)),
                       pattern=str(options.get("pattern", PATTERN)),
                       low=float(options.get("min", 1.0)), high=float(options.get("max", 10.0)))
            re.compile(opts.pattern)
        except (TypeError, ValueError, re.error) as err:
            raise ItemError(f"bad judge options: {err}") from None
        if opts.high <= opts.low:
            raise ItemError(f"judge range is empty: min {opts.low} >= max {opts.high}")
        return opts


def parse_score(text: str, opts: JudgeOptions) -> float:
    """The judge's number mapped onto [0, 1]; ItemError when absent or out of range."""
    matches = list(re.finditer(opts.pattern, text))
    if not matches:
        raise ItemError(f"judge answer has no score matching {opts.pattern!r}: {text[:200]!r}")
    found = matches[-1]
    raw = found.group(1) if found.groups() else found.group(0)
    try:
        value = float(raw)
    except ValueError:
        raise ItemError(f"judge score {raw!r} is not a number") from None
    if not opts.low <= value <= opts.high:
        raise ItemError(f"judge score {value} is outside [{opts.low}, {opts.high}]")
    return (value - opts.low) / (opts.high - opts.low)


def render(item: ScoreItem, opts: JudgeOptions) -> str:
    fields = {"prompt": item.prompt or "", "completion": item.completion or "",
              "reference": item.reference or "", "min": _num(opts.low), "max": _num(opts.high)}
    try:
        return opts.template.format_map(fields)
    except (KeyError, IndexError, ValueError) as err:
        raise ItemError(f"judge template cannot be filled: {err!r}") from None


def _num(value: float) -> str:
    return str(int(value)) if value.is_integer() else str(value)


def messages(item: ScoreItem, text: str) -> list[dict[str, Any]]:
    if not item.frames():
        return [{"role": "user", "content": text}]
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": frame}} for frame in item.frames()
    ]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


async def score(item: ScoreItem, ctx: ScorerContext) -> float:
    opts = JudgeOptions.parse(ctx.options)
    answer = await ctx.chat(messages(item, render(item, opts)), **SAMPLING)
    return parse_score(answer, opts)
