"""`listwise`: one judge prompt lists the whole group and asks a score for each candidate.

Options: `template` (fields {prompt}, {reference}, {candidates}, {count}, {min}, {max};
{candidates} is the numbered list of the group's distinct candidates, in digest order),
`pattern` (RE2 with two groups: the candidate's number, from 1, and its score; for each
candidate the last match wins), `min` and `max` (the scale, mapped onto [0, 1]).

A candidate the answer gives no score for (or one outside the scale) is its items' error, never
a 0; the other candidates keep theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grm_service.errors import InvalidRequest
from grm_service.scoring import judge
from grm_service.scoring.groups.canon import Candidate
from grm_service.scoring.groups.scorer import GroupContext, GroupScorer, Outcome, Task, messages

TEMPLATE = (
    "You are a strict grader. Rate each of the {count} responses to the task on a scale from "
    "{min} to {max}.\n\nTask:\n{prompt}\n\nReference answer (may be empty):\n{reference}\n\n"
    "{candidates}\n\nEnd your reply with one line per response: 'Response <number>: <score>'."
)
PATTERN = r"(?i)response\s*(\d+)\s*[:=]\s*(-?\d+(?:\.\d+)?)"
OPTIONS = ("template", "pattern", "min", "max")
_TEXT_FIELDS = ("prompt", "reference", "candidates")
_FIELDS = (*_TEXT_FIELDS, "count", "min", "max")
OPTIONS_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": {
    "template": {"type": "string", "maxLength": judge.MAX_TEMPLATE_CHARS, "default": TEMPLATE},
    "pattern": {"type": "string", "maxLength": judge.MAX_PATTERN_CHARS, "default": PATTERN},
    "min": {"type": "number", "default": 1}, "max": {"type": "number", "default": 10},
}}


@dataclass(frozen=True)
class ListOptions:
    pieces: judge.Pieces
    pattern: Any  # a compiled re2 pattern with two groups
    low: float
    high: float

    @classmethod
    def parse(cls, options: dict[str, Any]) -> ListOptions:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise InvalidRequest(f"listwise options: unknown {', '.join(unknown)}; "
                                 f"known: {', '.join(OPTIONS)}")
        template = judge.text_option(options, "template", TEMPLATE, judge.MAX_TEMPLATE_CHARS,
                                     "listwise")
        pattern = judge.compiled(judge.text_option(options, "pattern", PATTERN,
                                                   judge.MAX_PATTERN_CHARS, "listwise"))
        if pattern.groups < 2:
            raise InvalidRequest("listwise pattern needs two groups: the candidate's number, "
                                 "then its score")
        low, high = judge.scale(options, "listwise")
        return cls(pieces=judge.fielded_pieces(template, _FIELDS, _TEXT_FIELDS, "listwise"),
                   pattern=pattern, low=low, high=high)


def check_options(options: dict[str, Any]) -> None:
    ListOptions.parse(options)


def listing(cands: list[Candidate]) -> str:
    return "\n\n".join(f"Response {n}:\n{c.completion}" for n, c in enumerate(cands, 1))


def scores(text: str, count: int, opts: ListOptions) -> dict[int, str]:
    """Candidate number (from 1) -> the raw score the answer gives it last."""
    found: dict[int, str] = {}
    for match in opts.pattern.finditer(text):
        number, raw = match.group(1), match.group(2)
        if number is not None and number.isdigit() and 1 <= int(number) <= count:
            found[int(number)] = raw
    return found


def normalised(raw: str | None, opts: ListOptions) -> float:
    """A raw score mapped onto [0, 1]; ValueError saying why it cannot be."""
    if raw is None:
        raise ValueError("the judge's answer gives it no score matching "
                         f"{opts.pattern.pattern!r}")
    value = float(raw)
    if not opts.low <= value <= opts.high:
        raise ValueError(f"its score {value} is outside [{opts.low}, {opts.high}]")
    return (value - opts.low) / (opts.high - opts.low)


async def judge_list(cands: list[Candidate], task: Task, ctx: GroupContext) -> list[Outcome]:
    opts = ListOptions.parse(ctx.options)
    text = judge.fill(opts.pieces, {
        "prompt": task.prompt, "reference": task.reference, "candidates": listing(cands),
        "count": str(len(cands)), "min": judge.num(opts.low), "max": judge.num(opts.high)})
    shown = [(f"Response {n}", c.frames) for n, c in enumerate(cands, 1)]
    asked = await ctx.ask("listwise", [c.digest for c in cands], messages(text, shown),
                          judge.SAMPLING)
    responses = [asked.text] if asked.text is not None else []
    prints = [asked.fingerprint] if asked.fingerprint is not None else []
    if asked.text is None:
        return [Outcome(None, asked.error, responses, prints) for _ in cands]
    found = scores(asked.text, len(cands), opts)
    out = []
    for n in range(1, len(cands) + 1):
        try:
            out.append(Outcome(normalised(found.get(n), opts), None, responses, prints))
        except ValueError as err:
            out.append(Outcome(None, f"response {n} of the list: {err}", responses, prints))
    return out


SCORER = GroupScorer(check_options=check_options, options_schema=OPTIONS_SCHEMA,
                     judge=judge_list)
