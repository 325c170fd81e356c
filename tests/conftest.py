from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest_plugins = ["tests.support.census"]

_PYTEST_OWN = {"PYTEST_CURRENT_TEST"}


def _snapshot() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _PYTEST_OWN}


@pytest.fixture(autouse=True)
def _environ_unchanged() -> Iterator[None]:
    """Library code must never mutate os.environ (children get explicit env)."""
    before = _snapshot()
    yield
    assert _snapshot() == before, "os.environ was changed by the code under test"
