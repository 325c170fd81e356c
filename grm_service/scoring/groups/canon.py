"""The canonical order of a group: candidates by content digest, seeds from digests.

Nothing here looks at arrival order: the candidates of a group are the distinct contents of its
items (what is judged: the completion and the image frames), sorted by their digests; every
prompt lists them, and every pair names them, in that order; each judge request's seed is
derived from the base seed and the digests it judges. Rewards are summed in that order too
(`math.fsum`). So a group's rewards are the same bits under any permutation of its items, any
arrival order and any concurrency.

Items with the same content are one candidate: judged once, and each gets that candidate's
reward, responses and fingerprint (a copy of a completion neither beats nor ties itself).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from grm_service.canonical import canonical_json
from grm_service.fingerprint import json_digest
from grm_service.scoring.models import ScoreItem

SEED_MASK = (1 << 31) - 1  # seeds in the range of the service's own seed (GRM_SEED)


@dataclass(frozen=True)
class Candidate:
    """One distinct content of a group, and the ids of the items that carry it."""

    digest: str
    completion: str
    frames: tuple[str, ...]
    ids: tuple[str, ...]


def content_digest(item: ScoreItem) -> str:
    """The digest of what is judged of `item` (images already as data URLs)."""
    return json_digest({"completion": item.completion or "", "frames": item.frames()})


def candidates(items: list[ScoreItem]) -> list[Candidate]:
    """The distinct contents of `items`, sorted by digest; the ids of each sorted too."""
    by_digest: dict[str, list[ScoreItem]] = {}
    for item in items:
        by_digest.setdefault(content_digest(item), []).append(item)
    return [
        Candidate(digest=d, completion=same[0].completion or "",
                  frames=tuple(same[0].frames()), ids=tuple(sorted(i.id for i in same)))
        for d, same in sorted(by_digest.items())
    ]


def derive_seed(base: int, kind: str, digests: list[str]) -> int:
    """The seed of one judge request: a function of the base seed (the service's, or the
    request's sampling seed) and of the digests it judges, in their order in the prompt."""
    raw = hashlib.sha256(canonical_json([base, kind, digests])).digest()
    return int.from_bytes(raw[:8], "big") & SEED_MASK


def group_digest(scope: str, scorer: str, options: dict[str, object],
              sampling: dict[str, object], group_id: str | None) -> str:
    """The opaque name of a group for holding: the asker's API key scope, the scorer, its options
    and sampling, and the group id; two askers (or two configurations) never share a group."""
    return json_digest({"scope": scope, "scorer": scorer, "options": options,
                        "sampling": sampling, "group_id": group_id})
