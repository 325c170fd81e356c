"""THE canonical JSON of a request body: one byte string per logical request.

Routing keys (crc32 of it), request digests and fingerprint ids are computed over these bytes, so
they are the service's wire contract: a change here changes every key and digest.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import c_encode_basestring, c_make_encoder  # type: ignore[attr-defined]
from typing import Any

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
