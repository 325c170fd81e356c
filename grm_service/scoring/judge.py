"""An LLM judge: a prompt asks for a numeric score, a regex reads it, the range normalises it.

Options (request `options`): `template` (fields {prompt}, {completion}, {reference}, {min},
{max}), `pattern` (a regex whose first group is the number; the last match wins, as judges tend
to restate their verdict at the end), `min` and `max` (the scale, mapped onto [0, 1]).

Both text options come from clients, so both are bounded:
- `pattern` runs on RE2 (google-re2), whose matching time is linear in the text: no pattern can
  backtrack catastrophically and hold the event loop (Python's `re` on `(\\w|\\w)+!` takes
  seconds on 25 characters). The cost of that choice: no backreferences or look-around, which a
  score-reading pattern does not need. A timeout instead would still burn its whole budget per
  item, and operator-only patterns would take the option away from clients.
- `template` is filled by plain substitution: only the five names above, no format specs
  (`{prompt:>100000000}` would pad to 100 MB), no conversions, no attribute or index access
  (`{prompt.__class__}`), and each text field at most once, so the rendered prompt is never
  larger than the template plus what the item sent.
"""

from __future__ import annotations

import functools
import math
import string
from dataclasses import dataclass
from typing import Any

import re2

from grm_service.errors import InvalidRequest
from grm_service.scoring.context import ItemError, ScorerContext
from grm_service.scoring.models import ScoreItem

TEMPLATE = (
    "You are a strict grader. Rate the response to the task on a scale from {min} to {max}.\n\n"
    "Task:\n{prompt}\n\nReference answer (may be empty):\n{reference}\n\n"
    "Response:\n{completion}\n\nEnd your reply with a line 'Score: <number>'."
)
PATTERN = r"(?i)score\s*[:=]\s*(-?\d+(?:\.\d+)?)"
SAMPLING = {"temperature": 0.0, "max_tokens": 512}
OPTIONS = ("template", "pattern", "min", "max")
MAX_TEMPLATE_CHARS = 16 * 1024
MAX_PATTERN_CHARS = 1024
_TEXT_FIELDS = ("prompt", "completion", "reference")
_FIELDS = (*_TEXT_FIELDS, "min", "max")
_RE2_MAX_MEM = 1 << 20  # a compiled pattern's memory; bigger ones are refused
OPTIONS_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": {
    "template": {"type": "string", "maxLength": MAX_TEMPLATE_CHARS, "default": TEMPLATE},
    "pattern": {"type": "string", "maxLength": MAX_PATTERN_CHARS, "default": PATTERN},
    "min": {"type": "number", "default": 1}, "max": {"type": "number", "default": 10},
}}


# (literal, field or None) pairs
Pieces = tuple[tuple[str, str | None], ...]


@dataclass(frozen=True)
class JudgeOptions:
    pieces: Pieces
    pattern: Any  # a compiled re2 pattern (google-re2 ships no type information)
    low: float = 1.0
    high: float = 10.0

    @classmethod
    def parse(cls, options: dict[str, Any]) -> JudgeOptions:
        """The judge's options; InvalidRequest (the whole request is wrong) says which and why."""
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise InvalidRequest(f"judge options: unknown {', '.join(unknown)}; "
                                 f"known: {', '.join(OPTIONS)}")
        template = text_option(options, "template", TEMPLATE, MAX_TEMPLATE_CHARS)
        pattern = text_option(options, "pattern", PATTERN, MAX_PATTERN_CHARS)
        low, high = scale(options)
        return cls(pieces=template_pieces(template), pattern=compiled(pattern), low=low,
                   high=high)


def scale(options: dict[str, Any], scorer: str = "judge") -> tuple[float, float]:
    """The `min` and `max` options (default 1 and 10); InvalidRequest when the range is empty."""
    low = number_option(options, "min", 1.0, scorer)
    high = number_option(options, "max", 10.0, scorer)
    if high <= low:
        raise InvalidRequest(f"{scorer} range is empty: min {low} >= max {high}")
    return low, high


def text_option(options: dict[str, Any], name: str, default: str, limit: int,
                scorer: str = "judge") -> str:
    value = options.get(name, default)
    if not isinstance(value, str):
        raise InvalidRequest(f"{scorer} option {name} must be a string")
    if len(value) > limit:
        raise InvalidRequest(f"{scorer} option {name} is {len(value)} characters; the limit is "
                             f"{limit}")
    return value


def number_option(options: dict[str, Any], name: str, default: float,
                  scorer: str = "judge") -> float:
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(f"{scorer} option {name} must be a finite number, not "
                             f"{value!r:.40}")
    return float(value)


def template_pieces(template: str) -> Pieces:
    """The judge's template split into literals and field names; InvalidRequest otherwise."""
    return fielded_pieces(template, _FIELDS, _TEXT_FIELDS, "judge")


@functools.lru_cache(maxsize=64)
def fielded_pieces(template: str, fields: tuple[str, ...], text_fields: tuple[str, ...],
                   scorer: str) -> Pieces:
    """`template` split into literals and the names of `fields`, each of `text_fields` used at
    most once (the rendered text is never larger than the template plus what was sent);
    InvalidRequest for anything else."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise InvalidRequest(f"{scorer} template cannot be parsed: {err}") from None
    pieces: list[tuple[str, str | None]] = []
    for literal, field, spec, conversion in parsed:
        if field is not None and (field not in fields or spec or conversion):
            shown = "{" + field + (f"!{conversion}" if conversion else "") + \
                (f":{spec}" if spec else "") + "}"
            raise InvalidRequest(f"{scorer} template field {shown[:60]!r} is not accepted: "
                                 f"only {', '.join('{' + f + '}' for f in fields)}, without "
                                 "format specs, conversions or attribute access")
        pieces.append((literal, field))
    for name in text_fields:
        uses = sum(field == name for _, field in pieces)
        if uses > 1:
            raise InvalidRequest(f"{scorer} template uses {{{name}}} {uses} times; each of "
                                 f"{', '.join(text_fields)} may appear once")
    return tuple(pieces)


def fill(pieces: Pieces, fields: dict[str, str]) -> str:
    """The template's pieces with their fields substituted."""
    return "".join(literal + (fields[field] if field else "") for literal, field in pieces)


@functools.lru_cache(maxsize=64)
def compiled(pattern: str) -> Any:
    options = re2.Options()
    options.log_errors = False
    options.max_mem = _RE2_MAX_MEM
    try:
        return re2.compile(pattern, options)
    except re2.error as err:
        detail = err.args[0].decode(errors="replace") if err.args and isinstance(
            err.args[0], bytes) else str(err)
        raise InvalidRequest(f"judge pattern {pattern[:60]!r} is not accepted by RE2 (no "
                             f"backreferences or look-around): {detail}") from None


def parse_score(text: str, opts: JudgeOptions) -> float:
    """The judge's number mapped onto [0, 1]; ItemError when absent or out of range."""
    matches = list(opts.pattern.finditer(text))
    if not matches:
        raise ItemError(f"judge answer has no score matching {opts.pattern.pattern!r}: "
                        f"{text[:200]!r}")
    found = matches[-1]
    raw = found.group(1) if found.groups() else found.group(0)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ItemError(f"judge score {raw!r} is not a number") from None
    if not opts.low <= value <= opts.high:
        raise ItemError(f"judge score {value} is outside [{opts.low}, {opts.high}]")
    return (value - opts.low) / (opts.high - opts.low)


def render(item: ScoreItem, opts: JudgeOptions) -> str:
    fields = {"prompt": item.prompt or "", "completion": item.completion or "",
              "reference": item.reference or "", "min": num(opts.low), "max": num(opts.high)}
    return fill(opts.pieces, fields)


def num(value: float) -> str:
    return str(int(value)) if value.is_integer() else str(value)


def messages(item: ScoreItem, text: str) -> list[dict[str, Any]]:
    if not item.frames():
        return [{"role": "user", "content": text}]
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": frame}} for frame in item.frames()
    ]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def check_options(options: dict[str, Any]) -> None:
    JudgeOptions.parse(options)


async def score(item: ScoreItem, ctx: ScorerContext) -> float:
    opts = JudgeOptions.parse(ctx.options)
    answer = await ctx.chat(messages(item, render(item, opts)), **SAMPLING)
    return parse_score(answer, opts)
