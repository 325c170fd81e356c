"""Reference answers out of trainers' ground truths: the one rule the adapters (client side)
and the OpenRLHF route (server side) share, so it imports nothing but the standard library
and the server that uses it never loads the client."""

from __future__ import annotations

from typing import Any


def references(value: Any) -> list[str]:
    """Every acceptable answer in a ground truth: a string, a number, a list or a numpy array
    (verl's parquet loader gives arrays; `str()` of one is "['4' 'four']", never an answer)."""
    if value is None:
        return []
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        value = value.tolist()  # numpy array or scalar, torch tensor
    if isinstance(value, list | tuple):
        return [text for v in value for text in references(v)]
    if isinstance(value, bytes):
        return [value.decode()]
    return [str(value)]
