"""One process that brings members of held groups, as one gateway worker would: run as
`python -m tests.support.held_member SPEC_JSON`; prints its results as JSON.

SPEC: `file` (the groups file), `groups` ({group: {"size": n, "items": [item, ...]}}), the
`hold` bounds, `judged` (a file each finished judge call appends its group to, one line), and
`hang` (a file: the first judge call to create it writes its pid there and hangs, as a claimer
that will be killed mid-judge).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import zlib
from pathlib import Path
from typing import Any

from grm_service.scoring.batch import item_digest
from grm_service.scoring.groups.held import HeldGroups, HoldSettings
from grm_service.scoring.models import ItemResult, ScoreItem


def group_scores(items: list[ScoreItem]) -> dict[str, float]:
    """A deterministic group judge's scores: each item's rank among the group's completions
    (by crc32), over the group's size, so that a score depends on the whole group."""
    ranked = sorted(items, key=lambda i: (zlib.crc32((i.completion or "").encode()), i.id))
    return {item.id: rank / len(items) for rank, item in enumerate(ranked)}


def judge_for(spec: dict[str, Any]) -> Any:
    async def judge(items: list[ScoreItem]) -> dict[str, ItemResult]:
        hang = spec.get("hang")
        if hang:
            try:
                fd = os.open(hang, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                await asyncio.sleep(3600)
        scores = group_scores(items)
        with open(spec["judged"], "a") as log:
            log.write(f"{items[0].group_id}\n")
        return {i: ItemResult(id=i, score=s, status="ok", digest=item_digest(i, s, None))
                for i, s in scores.items()}

    return judge


async def main(spec: dict[str, Any]) -> dict[str, Any]:
    held = HeldGroups(HoldSettings(path=Path(spec["file"]), **spec["hold"]))
    await held.start()
    judge = judge_for(spec)

    async def one(group: str, size: int, items: list[dict[str, Any]]) -> dict[str, Any]:
        members = [ScoreItem.model_validate(i) for i in items]
        results = await held.score_held(group, size, members, judge)
        return {i: r.model_dump(mode="json") for i, r in results.items()}

    try:
        groups = spec["groups"]
        answers = await asyncio.gather(*(one(g, v["size"], v["items"]) for g, v in groups.items()))
        return dict(zip(groups, answers, strict=True))
    finally:
        await held.close()


if __name__ == "__main__":
    out = asyncio.run(main(json.loads(sys.argv[1])))
    sys.stdout.write(json.dumps(out))
