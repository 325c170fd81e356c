"""Where judging a whole group meets gathering a group whose items come in several requests.

A trainer that calls once per sample (verl) sends each item with its `group_id` and
`group_size`. The judging side knows how to score a complete group; the holding side knows how
to wait for one, whichever request, worker or restart its items come by. This Protocol is all
each needs to know of the other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from grm_service.scoring.models import ItemResult, ScoreItem

# Scores a complete group (every member, in any order); its results by item id.
Judge = Callable[[list[ScoreItem]], Awaitable[dict[str, ItemResult]]]


class Holder(Protocol):
    async def score_held(
        self, group: str, size: int, members: list[ScoreItem], judge: Judge
    ) -> dict[str, ItemResult]:
        """Hold `members` (one request's items of `group`, an opaque digest that already
        names the asker, scorer, options and sampling) until the group has `size` items;
        then have the complete group judged once, by one waiter, and return the results of
        `members` by item id. A group that does not fill in time gives each waiting member an
        error result that says so, never a silent score."""
        ...
