"""Scorer lookup: the built-ins plus custom `NAME=module:function` entries from settings.

A custom scorer is any `fn(item: ScoreItem, ctx: ScorerContext) -> float`, sync or async; it may
call `await ctx.chat(messages, **sampling)` / `ctx.classify(messages)` / `ctx.embed(body)` to
ask the model, or score by rule alone. Example: `GRM_SCORERS=exact=my_rewards:exact_match` with

    def exact_match(item, ctx):
        return float((item.completion or "").strip() == (item.reference or "").strip())
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from collections.abc import Callable
from typing import Any

from grm_service.errors import ConfigError, UnknownScorer
from grm_service.scoring import classify, clip, judge, ocr, reward_head
from grm_service.scoring.context import Finish, ItemError, Scorer, ScorerContext
from grm_service.scoring.groups import listwise, pairwise
from grm_service.scoring.groups.scorer import GroupScorer
from grm_service.scoring.models import ScoreItem, ScoreRequest

log = logging.getLogger(__name__)

UserScorer = Callable[[ScoreItem, ScorerContext], Any]

BUILTIN: dict[str, Scorer] = {"ocr": ocr.score, "judge": judge.score, "classify": classify.score,
                               "reward_head": reward_head.score, "clip": clip.score}
# Scorers of whole groups (scoring/groups): a request's items are judged group by group.
GROUP: dict[str, GroupScorer] = {"pairwise": pairwise.SCORER, "listwise": listwise.SCORER}
# Request-level option checks of the built-ins (InvalidRequest -> 400 before any item runs);
# a custom scorer reads its options itself.
OPTION_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "ocr": ocr.check_options, "judge": judge.check_options, "classify": classify.check_options,
    "reward_head": reward_head.check_options, "clip": clip.check_options,
    **{name: group.check_options for name, group in GROUP.items()},
}
OPTION_SCHEMAS: dict[str, dict[str, Any]] = {
    "ocr": ocr.OPTIONS_SCHEMA, "judge": judge.OPTIONS_SCHEMA, "classify": classify.OPTIONS_SCHEMA,
    "reward_head": reward_head.OPTIONS_SCHEMA, "clip": clip.OPTIONS_SCHEMA,
    **{name: group.options_schema for name, group in GROUP.items()},
}


def parse_spec(spec: str) -> tuple[str, str, str]:
    """`NAME=module:function` -> (name, module, function); ConfigError when malformed."""
    name, eq, target = spec.partition("=")
    module, colon, function = target.partition(":")
    if not (eq and colon and name.strip() and module.strip() and function.strip()):
        raise ConfigError(f"scorer {spec!r} must look like NAME=module:function")
    return name.strip(), module.strip(), function.strip()


def load(module: str, function: str) -> UserScorer:
    try:
        found = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"cannot load scorer {module}:{function}: {err}") from err
    if not callable(found):
        raise ConfigError(f"scorer {module}:{function} is not callable")
    return found  # type: ignore[no-any-return]


def guarded(name: str, fn: UserScorer) -> Scorer:
    """Run user code so that any failure, or a non-number, becomes that item's error."""

    async def run(item: ScoreItem, ctx: ScorerContext) -> float:
        try:
            value = fn(item, ctx)
            if inspect.isawaitable(value):
                value = await value
        except ItemError:
            raise
        except Exception as err:  # user code: any failure is this item's, never the batch's
            log.warning("scorer %s failed on item %s: %r", name, item.id, err)
            raise ItemError(f"scorer {name} raised {type(err).__name__}: {err}") from err
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ItemError(f"scorer {name} returned {type(value).__name__}, not a number")
        return float(value)

    return run


@functools.cache
def _registry(specs: tuple[str, ...]) -> dict[str, Scorer | GroupScorer]:
    scorers: dict[str, Scorer | GroupScorer] = {**BUILTIN, **GROUP}
    for spec in specs:
        name, module, function = parse_spec(spec)
        scorers[name] = guarded(name, load(module, function))
        log.info("registered scorer %s = %s:%s", name, module, function)
    return scorers


def lookup(name: str, specs: tuple[str, ...] = ()) -> Scorer | GroupScorer:
    scorers = _registry(specs)
    if name not in scorers:
        raise UnknownScorer(f"unknown scorer {name!r}; registered: {', '.join(sorted(scorers))}")
    return scorers[name]


def registered(specs: tuple[str, ...] = ()) -> list[str]:
    """Every scorer name; loads custom scorers, so a bad spec raises ConfigError here."""
    return sorted(_registry(specs))


# Request-level item checks of the built-ins (400 before any item runs).
ITEM_CHECKS: dict[str, Callable[[list[ScoreItem], dict[str, Any]], None]] = {
    "ocr": ocr.check_items, "clip": clip.check_items,
}
# Steps over a whole batch's results, of the built-ins that have one.
FINISHES: dict[str, Finish] = {"clip": clip.finish}


def finish_of(name: str, scorer: Scorer) -> Finish | None:
    return FINISHES.get(name) if BUILTIN.get(name) is scorer else None


def builtin(name: str, scorer: Scorer | GroupScorer) -> bool:
    """Whether `scorer` is the built-in of that name (a custom scorer may reuse the name)."""
    return BUILTIN.get(name) is scorer or GROUP.get(name) is scorer


def check_options(name: str, scorer: Scorer | GroupScorer, options: dict[str, Any]) -> None:
    """The built-in scorer's option check (a custom scorer may reuse a built-in's name)."""
    if builtin(name, scorer):
        OPTION_CHECKS[name](options)


def check_request(name: str, scorer: Scorer | GroupScorer, req: ScoreRequest) -> None:
    """The built-in scorer's checks of a whole request: its options, then its items."""
    check_options(name, scorer, req.options)
    if builtin(name, scorer) and name in ITEM_CHECKS:
        ITEM_CHECKS[name](req.items, req.options)


def check_option_set(name: str, options: dict[str, Any], specs: tuple[str, ...] = ()) -> None:
    """`check_options` by scorer name (a preset's options, checked at start-up)."""
    check_options(name, lookup(name, specs), options)
