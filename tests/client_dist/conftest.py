"""The client distribution as a trainer's environment gets it: its wheel installed on Python
3.10 and 3.11 with nothing but its dependencies, in the venvs tests/support/client_env.py builds
(`.ci/run` does). Collected where GRM_CLIENT_ENV names that folder:

    GRM_CLIENT_ENV=.venv-client .venv/bin/python -m pytest tests/client_dist

The gateway these tests score through runs from this (the server's) environment, on STUB
replicas: what is under test is the client's side of the wire.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import Proc, gateway_on_stubs

ENV = os.environ.get("GRM_CLIENT_ENV")
if not ENV:
    collect_ignore_glob = ["test_*.py"]

KEY = "client-key"


@pytest.fixture(scope="session")
def client_env() -> Path:
    where = Path(ENV or "").resolve()
    assert (where / "ready").is_file(), (
        f"{where} is not a finished client environment: run tests/support/client_env.py {ENV}")
    return where


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """A keyed gateway on two STUB replicas (its default scorers: `ocr` among them)."""
    with gateway_on_stubs(tmp_path_factory.mktemp("client-dist"),
                          env={"GRM_API_KEYS": KEY}) as (gw, _):
        yield gw
