from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.procs import Proc, start_stub


@pytest.fixture(scope="session")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """One STUB backend (served model "rm", recording the last 64 bodies) on 127.0.0.1 port 0,
    shared by the tests that put a gateway in front of a replica."""
    proc = start_stub(tmp_path_factory.mktemp("stub"), "--record", "64")
    yield proc
    proc.stop()
