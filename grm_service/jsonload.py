"""Engine answers parsed at msgspec's speed, with `json.loads`' result.

Every answer the gateway forwards is parsed once, and an answer with 128 tokens of logprobs is
~13 KB: `json.loads` spends ~90 us on it, msgspec's decoder (C; vLLM depends on it) ~35 us. For
every document msgspec accepts, it builds the same Python values `json.loads` does: dicts in
document order, the last of duplicate keys, correctly rounded floats, integers of any size.
What it refuses and `json.loads` may take (NaN and Infinity literals, 1e999, lone surrogates, a
byte-order mark, other encodings of bytes, nesting past its depth) is parsed by `json.loads`,
so the value `loads_strict(raw)` gives is `json.loads(raw)` for every input, its errors included.
`tests/unit/test_jsonload.py` holds it to that.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

_DECODER = msgspec.json.Decoder()


def loads_strict(raw: bytes) -> tuple[Any, bool]:
    """The value, and whether `raw` is strict JSON (RFC 8259, UTF-8: what msgspec accepts), so
    that the bytes themselves may be sent on as JSON of the value."""
    try:
        return _DECODER.decode(raw), True
    except (msgspec.DecodeError, RecursionError):
        return json.loads(raw), False
