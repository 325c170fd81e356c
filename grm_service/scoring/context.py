"""What a scorer sees: the item's options and a way to ask the model that records the answers."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from grm_service.dual_scales import DualScales
from grm_service.errors import InvalidRequest, ReplicaFailed, ReplicaRejected
from grm_service.fingerprint import Fingerprint
from grm_service.scoring.models import ItemResult, ScoreItem

CHAT_PATH = "/v1/chat/completions"
CLASSIFY_PATH = "/classify"
EMBED_PATH = "/v1/embeddings"

Reply = tuple[dict[str, Any], Fingerprint]
Send = Callable[[str, dict[str, Any]], Awaitable[Reply]]


class ItemError(Exception):
    """This item cannot be scored (bad image, unparsable judge answer...); the others still are.

    It stays inside the scoring flow: the batch turns it into `status: error` with this message.
    """


@dataclass
class ScorerContext:
    """One item's conversation with the service; built per item, never shared."""

    send: Send
    sampling: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    responses: list[str] = field(default_factory=list)
    fingerprints: list[Fingerprint] = field(default_factory=list)
    # The served dual encoder's scalars (read from its checkpoint at start-up), or None.
    scales: DualScales | None = None

    async def chat(self, messages: list[dict[str, Any]], **defaults: Any) -> str:
        """The assistant text for `messages`; request `sampling` overrides the scorer defaults."""
        body = {"messages": messages, **defaults, **self.sampling}
        payload, fingerprint = await self.send(CHAT_PATH, body)
        text = content(payload)
        self.responses.append(text)
        self.fingerprints.append(fingerprint)
        return text

    async def classify(
        self, messages: list[dict[str, Any]], activation: bool = True
    ) -> list[float]:
        """A sequence classifier's outputs: probabilities, or raw values without activation."""
        body = {"messages": messages, "use_activation": activation}
        payload, fingerprint = await self.send(CLASSIFY_PATH, body)
        values = _class_outputs(payload)
        self.responses.append(json.dumps(values))
        self.fingerprints.append(fingerprint)
        return values


    async def embed(self, body: dict[str, Any]) -> list[float]:
        """One embedding of `body` (`input` text or chat `messages`), as the engine sent it.
        The answer's digest is in the fingerprint; the vector itself is not kept as a response."""
        payload, fingerprint = await self.send(EMBED_PATH, body)
        self.fingerprints.append(fingerprint)
        return _embedding(payload)



# Failures of one item (InvalidRequest: the checkpoint refused what this item would send);
# anything else (ServiceUnavailable, Overloaded, bugs) fails the batch.
ITEM_FAILURES = (ItemError, ReplicaRejected, ReplicaFailed, InvalidRequest)

# A pointwise scorer; `Finish`: a scorer's step over a whole batch's results (in input
# order), given its items and options (clip's softmax).
Scorer = Callable[[ScoreItem, ScorerContext], Awaitable[float]]
Finish = Callable[[list[ScoreItem], list[ItemResult], dict[str, Any]], list[ItemResult]]


def _embedding(payload: dict[str, Any]) -> list[float]:
    try:
        values = payload["data"][0]["embedding"]
        return [float(v) for v in values]
    except (KeyError, IndexError, TypeError, ValueError):
        raise ItemError("the engine's /v1/embeddings answer has no data[0].embedding") from None


def content(payload: dict[str, Any]) -> str:
    """The assistant text of a chat answer; ItemError where it has none."""
    try:
        content = payload["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ItemError("the engine's answer has no choices[0].message") from None
    return content if isinstance(content, str) else ""


def _class_outputs(payload: dict[str, Any]) -> list[float]:
    try:
        probs = payload["data"][0]["probs"]
        return [float(p) for p in probs]
    except (KeyError, IndexError, TypeError, ValueError):
        raise ItemError("the engine's /classify answer has no data[0].probs") from None
