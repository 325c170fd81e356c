"""OpenRLHF's remote reward protocol (`--reward.remote_url`, formerly `--remote_rm_url`).

OpenRLHF POSTs `{"query": [...], "prompts": [...], "labels": [...]}`, where each query is the
prompt followed by the policy's response, decoded with the chat template's special tokens kept
(`<|im_end|>` and the like), and reads `{"rewards", "scores", "extra_logs"}`. Every value in
`extra_logs` must be one number per sample: OpenRLHF turns each into a tensor for its metrics.
The gateway validates the body (`grm_service.gateway.edge.routes_integrations`) and hands this
module the protocol's records; nothing here imports the server.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grm_service.integrations.truths import references
from grm_service.wire import ItemResult, ScoreItem

# The reward of a failed item when the URL does not say (`?error_reward=`); `extra_logs.grm_error`
# marks those samples, so they can be told apart from real zeros.
DEFAULT_ERROR_REWARD = 0.0

# Special tokens of the common chat templates: `<|...|>` (ChatML/Qwen, Llama 3, Phi, GPT-OSS...)
# and the SentencePiece/Gemma ones. `?special_tokens=keep` turns stripping off; a list strips
# exactly those strings instead: separated by spaces (`+` in a URL) or given as repeated
# `special_tokens=` parameters. Never by commas: OpenRLHF splits `--reward.remote_url` on them,
# so `special_tokens=<|im_end|>,</s>` would reach the gateway as `<|im_end|>` alone and make `</s>`
# a second reward "endpoint" that every other rollout posts to, and fails.
AUTO = "auto"
KEEP = "keep"
_AUTO_PATTERN = re.compile(
    r"<\|[^|<>\s]{1,64}\|>|</?s>|<(?:bos|eos|pad|unk)>|<(?:start|end)_of_turn>"
)


@dataclass(frozen=True, kw_only=True)
class RewardRequest:
    """What OpenRLHF posts: prompt + response per sample, and the prompts and labels if given."""

    query: list[str]
    prompts: list[str] | None = None
    labels: list[Any] | None = None


def cut_by_openrlhf(query: str) -> str | None:
    """Why OpenRLHF would cut a URL with this (raw, undecoded) query string, or None."""
    if "," not in query:
        return None
    return ("OpenRLHF splits --reward.remote_url on commas, so this URL would reach the gateway "
            "cut at its first comma, the rest posted to as a second endpoint: list special "
            "tokens separated by spaces ('+') or repeat special_tokens=; write a comma inside a "
            "value as %2C")


def token_pattern(special_tokens: str | Sequence[str]) -> re.Pattern[str] | None:
    """What `?special_tokens=` strips: auto (the common templates' tokens), keep, or a list
    (whitespace-separated, or several values)."""
    values = [special_tokens] if isinstance(special_tokens, str) else list(special_tokens)
    tokens = sorted({t for value in values for t in value.split()}, key=len, reverse=True)
    if not tokens:
        raise ValueError("special_tokens must be 'auto', 'keep' or a list of tokens separated "
                         "by spaces ('+' in a URL)")
    if tokens in ([AUTO], [KEEP]):
        return _AUTO_PATTERN if tokens == [AUTO] else None
    if AUTO in tokens or KEEP in tokens:
        raise ValueError("special_tokens: 'auto' and 'keep' stand alone, not in a list")
    return re.compile("|".join(map(re.escape, tokens)))


def clean(text: str, pattern: re.Pattern[str] | None) -> str:
    return text if pattern is None else pattern.sub("", text).strip()


def completion_of(query: str, prompt: str | None) -> str:
    """The response part of a query (OpenRLHF sends prompt + response as one string)."""
    if prompt and query.startswith(prompt):
        return query[len(prompt):]
    return query


def to_items(req: RewardRequest, special_tokens: str | Sequence[str] = AUTO
             ) -> list[ScoreItem]:
    pattern = token_pattern(special_tokens)
    n = len(req.query)
    prompts: Sequence[str | None] = req.prompts if req.prompts else [None] * n
    labels: Sequence[Any] = req.labels if req.labels else [None] * n
    if len(prompts) != n or len(labels) != n:
        raise ValueError(f"query, prompts and labels differ in length ({n}, "
                         f"{len(prompts)}, {len(labels)})")
    items = []
    for i, (q, p, label) in enumerate(zip(req.query, prompts, labels, strict=True)):
        answers = references(label)
        items.append(ScoreItem(
            id=str(i), prompt=None if p is None else clean(p, pattern),
            completion=clean(completion_of(q, p), pattern),
            reference=answers[0] if answers else None,
            extra={"references": answers} if len(answers) > 1 else {},
        ))
    return items


def to_response(results: Sequence[ItemResult], error_reward: float) -> dict[str, Any]:
    """Rewards in order, `error_reward` for failed items; `extra_logs.grm_error` flags those.
    The fingerprints and error messages ride outside `extra_logs` (OpenRLHF ignores them)."""
    values = [r.score if r.status == "ok" and r.score is not None else error_reward
              for r in results]
    return {
        "rewards": values,
        "scores": values,
        "extra_logs": {"grm_error": [float(r.status == "error") for r in results]},
        "grm_errors": [r.error for r in results],
        "grm_fingerprints": [r.fingerprint.to_json() if r.fingerprint else None
                             for r in results],
    }
