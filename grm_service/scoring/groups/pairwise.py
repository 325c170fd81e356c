"""`pairwise`: the judge compares two candidates at a time; a candidate's reward is its mean
points over its comparisons (a win 1, a tie 0.5, a loss 0, by default).

Options:
- `strategy`: `circular` (each candidate against the next in digest order, the last against
  the first: n comparisons) or `all_pairs` (every pair: n(n-1)/2);
- `both_orders`: also judge each pair with its candidates swapped (twice the requests), so that
  a judge's preference for a position cancels out;
- `template` (fields {prompt}, {reference}, {first}, {second}), `pattern` (RE2; its first group,
  else the whole match, is the verdict; the last match wins), `verdicts` (each verdict to the
  FIRST candidate's points in [0, 1]; the second gets 1 minus them; compared case-folded).

Inside every pair the first candidate is the one of smaller digest; with `both_orders` the
swapped comparison follows it. A verdict outside `verdicts` fails the comparison, and a failed
comparison fails each of its two candidates' items (never a silent 0).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

from grm_service.errors import InvalidRequest
from grm_service.scoring import judge
from grm_service.scoring.groups.canon import Candidate
from grm_service.scoring.groups.scorer import (
    Asked,
    GroupContext,
    GroupScorer,
    Outcome,
    Task,
    messages,
)

TEMPLATE = (
    "You compare two responses to a task.\n\nTask:\n{prompt}\n\n"
    "Reference answer (may be empty):\n{reference}\n\nResponse A:\n{first}\n\n"
    "Response B:\n{second}\n\nWhich response is better? End your reply with a line "
    "'Verdict: A', 'Verdict: B' or 'Verdict: tie'."
)
PATTERN = r"(?i)verdict\s*[:=]\s*\**\s*(A|B|tie)\b"
VERDICTS = {"a": 1.0, "b": 0.0, "tie": 0.5}
STRATEGIES = ("circular", "all_pairs")
OPTIONS = ("strategy", "both_orders", "template", "pattern", "verdicts")
MAX_VERDICTS = 64
MAX_VERDICT_CHARS = 64
_TEXT_FIELDS = ("prompt", "reference", "first", "second")
OPTIONS_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": {
    "strategy": {"enum": list(STRATEGIES), "default": "circular"},
    "both_orders": {"type": "boolean", "default": False},
    "template": {"type": "string", "maxLength": judge.MAX_TEMPLATE_CHARS, "default": TEMPLATE},
    "pattern": {"type": "string", "maxLength": judge.MAX_PATTERN_CHARS, "default": PATTERN},
    "verdicts": {"type": "object", "maxProperties": MAX_VERDICTS, "default": VERDICTS,
                 "additionalProperties": {"type": "number", "minimum": 0, "maximum": 1}},
}}


@dataclass(frozen=True)
class PairOptions:
    strategy: str
    both_orders: bool
    pieces: judge.Pieces
    pattern: Any  # a compiled re2 pattern
    verdicts: dict[str, float]

    @classmethod
    def parse(cls, options: dict[str, Any]) -> PairOptions:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise InvalidRequest(f"pairwise options: unknown {', '.join(unknown)}; "
                                 f"known: {', '.join(OPTIONS)}")
        strategy = options.get("strategy", "circular")
        if strategy not in STRATEGIES:
            raise InvalidRequest(f"pairwise option strategy must be one of "
                                 f"{', '.join(STRATEGIES)}, not {strategy!r:.40}")
        both = options.get("both_orders", False)
        if not isinstance(both, bool):
            raise InvalidRequest("pairwise option both_orders must be true or false")
        template = judge.text_option(options, "template", TEMPLATE, judge.MAX_TEMPLATE_CHARS,
                                     "pairwise")
        pattern = judge.text_option(options, "pattern", PATTERN, judge.MAX_PATTERN_CHARS,
                                    "pairwise")
        return cls(strategy=strategy, both_orders=both,
                   pieces=judge.fielded_pieces(template, _TEXT_FIELDS, _TEXT_FIELDS, "pairwise"),
                   pattern=judge.compiled(pattern), verdicts=_verdicts(options))


def _verdicts(options: dict[str, Any]) -> dict[str, float]:
    given = options.get("verdicts", VERDICTS)
    if not isinstance(given, dict) or not given or len(given) > MAX_VERDICTS:
        raise InvalidRequest(f"pairwise option verdicts must map 1 to {MAX_VERDICTS} verdicts "
                             "to the first candidate's points in [0, 1]")
    out: dict[str, float] = {}
    for key in given:
        if not isinstance(key, str) or not key or len(key) > MAX_VERDICT_CHARS:
            raise InvalidRequest(f"pairwise verdict {key!r:.40} must be 1 to "
                                 f"{MAX_VERDICT_CHARS} characters")
        points = judge.number_option(given, key, 0.0, "pairwise verdicts:")
        if not 0 <= points <= 1:
            raise InvalidRequest(f"pairwise verdict {key!r:.40} gives {points}; points are in "
                                 "[0, 1]")
        if key.casefold() in out:
            raise InvalidRequest(f"pairwise verdict {key!r:.40} appears twice (case-folded)")
        out[key.casefold()] = points
    return out


def check_options(options: dict[str, Any]) -> None:
    PairOptions.parse(options)


def pairs(count: int, strategy: str, both_orders: bool) -> list[tuple[int, int]]:
    """The comparisons of `count` candidates (indices in digest order), in their fixed order:
    (first, second) pairs, the first of smaller digest, its swap right after with
    `both_orders`."""
    if count < 2:
        return []
    if strategy == "all_pairs":
        base = [(i, j) for i in range(count) for j in range(i + 1, count)]
    elif count == 2:
        base = [(0, 1)]
    else:
        base = sorted((min(i, (i + 1) % count), max(i, (i + 1) % count)) for i in range(count))
    if not both_orders:
        return base
    return [p for i, j in base for p in ((i, j), (j, i))]


def verdict_points(text: str, opts: PairOptions) -> float:
    """The first candidate's points from the judge's answer; ValueError saying why not."""
    matches = list(opts.pattern.finditer(text))
    if not matches:
        raise ValueError(f"judge answer has no verdict matching {opts.pattern.pattern!r}: "
                         f"{text[:200]!r}")
    found = matches[-1]
    raw = found.group(1) if found.groups() else found.group(0)
    points = opts.verdicts.get((raw or "").casefold())
    if points is None:
        raise ValueError(f"verdict {raw!r:.60} is none of {', '.join(sorted(opts.verdicts))}")
    return points


async def judge_pairs(cands: list[Candidate], task: Task, ctx: GroupContext) -> list[Outcome]:
    opts = PairOptions.parse(ctx.options)
    order = pairs(len(cands), opts.strategy, opts.both_orders)
    asked = await asyncio.gather(*(_compare(cands[i], cands[j], task, opts, ctx)
                                   for i, j in order))
    return [_outcome(k, order, asked, len(cands)) for k in range(len(cands))]


async def _compare(first: Candidate, second: Candidate, task: Task, opts: PairOptions,
                   ctx: GroupContext) -> tuple[Asked, float | None, str | None]:
    text = judge.fill(opts.pieces, {"prompt": task.prompt, "reference": task.reference,
                                    "first": first.completion, "second": second.completion})
    shown = [("Response A", first.frames), ("Response B", second.frames)]
    asked = await ctx.ask("pairwise", [first.digest, second.digest], messages(text, shown),
                          judge.SAMPLING)
    if asked.text is None:
        return asked, None, asked.error
    try:
        return asked, verdict_points(asked.text, opts), None
    except ValueError as err:
        return asked, None, str(err)


def _outcome(k: int, order: list[tuple[int, int]],
             asked: list[tuple[Asked, float | None, str | None]], count: int) -> Outcome:
    if count == 1:
        return Outcome(score=0.5)  # alone in its group: every item has the same content
    terms: list[float] = []
    out = Outcome(score=None)
    for (i, j), (answer, points, error) in zip(order, asked, strict=True):
        if k not in (i, j):
            continue
        if answer.text is not None:
            out.responses.append(answer.text)
        if answer.fingerprint is not None:
            out.fingerprints.append(answer.fingerprint)
        if error is not None or points is None:
            out.error = out.error or f"a comparison of this item failed: {error}"
            continue
        terms.append(points if k == i else 1.0 - points)
    if out.error is None:
        out.score = math.fsum(terms) / len(terms)
    return out


SCORER = GroupScorer(check_options=check_options, options_schema=OPTIONS_SCHEMA,
                     judge=judge_pairs)
