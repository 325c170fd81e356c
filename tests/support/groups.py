"""Group-scorer test helpers: a `Send` whose answers are a function of the exact body bytes."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from grm_service.canonical import canonical_json
from grm_service.scoring.context import Reply
from tests.support.scoring import fingerprint

# Verdicts and scores read from the first hex digit of a body digest: a different byte in a
# prompt, a seed or a pair's order gives a different reward.
HEX_VERDICTS = {**{d: 1.0 for d in "01234"}, **{d: 0.0 for d in "56789a"},
                **{d: 0.5 for d in "bcdef"}}
PAIRWISE_HEX = {"pattern": r"stub-([0-9a-f])", "verdicts": HEX_VERDICTS}
LISTWISE_HEX = {"pattern": r"([1-9])([0-9a-f])", "min": 0, "max": 9}


class HashSend:
    """Answers chat with `stub-<sha256 of the body's canonical JSON>`, as the stub replica
    does; records every body."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, path: str, body: dict[str, Any]) -> Reply:
        self.bodies.append(body)
        text = "stub-" + hashlib.sha256(canonical_json(body)).hexdigest()
        payload: dict[str, Any] = {"choices": [{"index": 0, "message": {"content": text}}]}
        return payload, fingerprint(body, payload)


def group_items(size: int, rng: random.Random, group_id: str | None = None,
                prompt: str = "Name a prime.") -> list[dict[str, Any]]:
    items = []
    for n in range(size):
        item: dict[str, Any] = {"id": f"c{n}", "prompt": prompt,
                                "completion": f"answer {rng.randrange(10**6)} #{n}"}
        if group_id is not None:
            item |= {"group_id": group_id, "group_size": size}
        items.append(item)
    return items
