"""The commands' rich consoles read the terminal's width once, when their module is imported:
under xdist that is 80 columns whatever a test's COLUMNS says, and a table row wraps. The tests
that read rows back get a wide console of their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rich.console import Console

from grm_service.commands import ledger, replay


@pytest.fixture(autouse=True)
def wide_consoles(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for module in (ledger, replay):
        monkeypatch.setattr(module, "console", Console(width=250))
    yield
