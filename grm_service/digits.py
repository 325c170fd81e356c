"""Integers that come from outside the service (a header, a query, a CLI argument, an engine's
argv, the environment, a folder's name), read from ASCII decimal digits alone.

`str.isdigit` takes every Unicode digit, and `int` takes some of those (`'٣'` is 3) but not others
(`'²'` raises), and also spaces, a sign and `_` separators: a check by one and a parse by the
other raised where the check said it could not (a 500), or read a number in a form nobody
documents.
"""

from __future__ import annotations

import re

_DIGITS = re.compile(r"[0-9]+")
INT64_MAX = 2**63 - 1


def is_decimal(text: str) -> bool:
    """`text` is ASCII digits alone (one at least)."""
    return _DIGITS.fullmatch(text) is not None


def decimal(text: str, most: int = INT64_MAX) -> int | None:
    """`text` as an integer in [0, `most`] where it is ASCII digits alone; else None."""
    if not is_decimal(text):
        return None
    significant = text.lstrip("0") or "0"
    # A longer text is past `most`, and `int` refuses texts of over 4300 digits (ValueError).
    if len(significant) > len(str(most)):
        return None
    value = int(significant)
    return value if value <= most else None
