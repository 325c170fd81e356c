"""Probe requests for checking determinism: built-in, or read from a manifest of real items."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_TOPICS = ["rivers", "prime numbers", "a lighthouse", "tea", "the moon", "circuits", "owls",
           "glass", "winter", "maps", "bread", "comets", "violins", "deserts", "ink", "bridges"]

# The OCR GenRM recipe's sampling: the nucleus edge is where batch variance shows first.
PROBE_SAMPLING: dict[str, Any] = {"temperature": 0.7, "top_p": 0.8, "max_tokens": 24,
                                  "logprobs": True}


def builtin_probes(count: int = 16, max_tokens: int | None = None) -> list[dict[str, Any]]:
    sampling = dict(PROBE_SAMPLING)
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    return [
        {"messages": [{"role": "user", "content": f"Describe {_TOPICS[i % len(_TOPICS)]} "
                       f"in one line (probe {i})."}], **sampling}
        for i in range(count)
    ]


def filler_requests(count: int) -> list[dict[str, Any]]:
    """Unrelated traffic that shares batches with the probes; its own outputs are not checked."""
    return [
        {"messages": [{"role": "user", "content": f"Filler {i}: " + "lorem ipsum " * (1 + i % 5)}],
         "temperature": 1.0, "max_tokens": 8 + (i % 3) * 8}
        for i in range(count)
    ]


def load_manifest(path: Path) -> list[dict[str, Any]]:
    """One chat-completion body per JSONL line (as a trainer would send it)."""
    bodies = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            body = json.loads(line)
        except ValueError as err:
            raise ValueError(f"{path}:{number}: not JSON ({err})") from None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise ValueError(f"{path}:{number}: expected an object with a 'messages' list")
        bodies.append(body)
    if not bodies:
        raise ValueError(f"{path}: no probe items")
    return bodies
