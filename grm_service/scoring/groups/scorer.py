"""What a group scorer is, and how it asks the judge: one seeded request per comparison.

A group scorer turns a group's candidates (`canon.candidates`: distinct contents, in digest
order) into one outcome per candidate. It reaches the model through `GroupContext.ask`, which
puts the seed derived from the judged digests into the body sent, so that the seed is in the
request digest, the fingerprint and the ledger, and `grm-service replay` sends the same bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from grm_service.fingerprint import Fingerprint
from grm_service.scoring.context import CHAT_PATH, ITEM_FAILURES, Send, content
from grm_service.scoring.groups.canon import Candidate, derive_seed


@dataclass(frozen=True)
class Asked:
    """One judge request: its answer text and fingerprint, or why it has none."""

    text: str | None
    fingerprint: Fingerprint | None
    error: str | None = None


@dataclass
class Outcome:
    """One candidate's reward (or error), with the answers and fingerprints it came from, in
    the canonical order of its comparisons."""

    score: float | None
    error: str | None = None
    responses: list[str] = field(default_factory=list)
    fingerprints: list[Fingerprint] = field(default_factory=list)


@dataclass(frozen=True)
class Task:
    """What a group's items share: the prompt and the reference."""

    prompt: str
    reference: str


@dataclass
class GroupContext:
    """One request's way to the judge: its sampling and options, the base seed the comparison
    seeds derive from, and the bound on judge requests in flight."""

    send: Send
    sampling: dict[str, Any]
    options: dict[str, Any]
    base_seed: int
    limit: asyncio.Semaphore

    async def ask(self, kind: str, digests: list[str], messages: list[dict[str, Any]],
                  defaults: dict[str, Any]) -> Asked:
        own = {k: v for k, v in self.sampling.items() if k != "seed"}
        body = {"messages": messages, **defaults, **own,
                "seed": derive_seed(self.base_seed, kind, digests)}
        try:
            async with self.limit:
                payload, fingerprint = await self.send(CHAT_PATH, body)
            return Asked(content(payload), fingerprint)
        except ITEM_FAILURES as err:
            return Asked(None, None, str(err))


Judge = Callable[[list[Candidate], Task, GroupContext], Awaitable[list[Outcome]]]


@dataclass(frozen=True)
class GroupScorer:
    """A scorer of whole groups: its option check (400 before any item runs), its options'
    JSON schema, and its judge (one outcome per candidate, in the candidates' order)."""

    check_options: Callable[[dict[str, Any]], None]
    options_schema: dict[str, Any]
    judge: Judge


def messages(text: str, shown: list[tuple[str, tuple[str, ...]]]) -> list[dict[str, Any]]:
    """A user turn: each labelled candidate's image frames (in the prompt's order), then the
    text; the text alone where no candidate has frames."""
    if not any(frames for _, frames in shown):
        return [{"role": "user", "content": text}]
    parts: list[dict[str, Any]] = []
    for label, frames in shown:
        if frames:
            parts.append({"type": "text", "text": f"{label}:"})
            parts += [{"type": "image_url", "image_url": {"url": f}} for f in frames]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]

