"""Request keys and replica choice: pure functions of (key, healthy replicas).

The key is crc32 of the canonical request body. Replicas are ranked by rendezvous (highest random
weight) hashing, so when a replica leaves only the keys it owned move, and when it comes back they
return to it. crc32 alone is linear over GF(2), which makes `crc32(key + name)` a poor weight; the
weight is a 64-bit mix of the key and a per-replica salt instead.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from json.encoder import c_encode_basestring, c_make_encoder  # type: ignore[attr-defined]
from typing import Any

_MASK64 = (1 << 64) - 1
_ENCODE_DEFAULT = json.JSONEncoder().default  # the TypeError json.dumps raises


def canonical_json(body: Any) -> bytes:
    """JSON with sorted keys and no whitespace: one byte string per logical request.

    Byte for byte `json.dumps(body, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False).encode()`: the C encoder json.dumps runs, without its Python wrapper
    (~5 us a call). `longstrings.canonical` gives the same bytes faster for inline images.
    """
    return "".join(canonical_encoder(c_encode_basestring)(body, 0)).encode()


def canonical_encoder(encode_str: Callable[[str], str]) -> Callable[[Any, int], Any]:
    """The encoder json.dumps builds for the canonical options (JSONEncoder.iterencode): a fresh
    `markers` dict (check_circular), its default, no indent, the separators, sort_keys, no
    skipkeys, allow_nan; `encode_str` writes each string (key or value)."""
    encoder: Callable[[Any, int], Any] = c_make_encoder(
        {}, _ENCODE_DEFAULT, encode_str, None, ":", ",", True, False, True)
    return encoder


def key_of(canonical: bytes) -> int:
    return zlib.crc32(canonical)


def key_of_parts(parts: Iterable[bytes | memoryview]) -> int:
    """`key_of` the concatenation of `parts`, without building it."""
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    return crc


def request_key(body: Mapping[str, Any]) -> int:
    return key_of(canonical_json(body))


def _mix64(x: int) -> int:
    """splitmix64 finaliser: spreads every input bit over the whole word."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def weight(key: int, replica: str) -> int:
    salt = zlib.crc32(replica.encode())
    return _mix64((key << 32) ^ salt)


def rendezvous_order(key: int, replicas: Sequence[str]) -> list[str]:
    """All replicas, best first; failover walks this list in order."""
    return sorted(replicas, key=lambda name: (weight(key, name), name), reverse=True)


def pick(key: int, replicas: Sequence[str]) -> str | None:
    order = rendezvous_order(key, replicas)
    return order[0] if order else None


def least_loaded_order(
    key: int, replicas: Sequence[str], inflight: Callable[[str], int]
) -> list[str]:
    """Fewest in-flight first; equal loads are broken by the rendezvous weight of the key."""
    return sorted(replicas, key=lambda name: (inflight(name), -weight(key, name), name))
