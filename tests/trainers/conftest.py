"""Trainer tests: TRL, verl and OpenRLHF from PyPI, in their own environment.

Those releases cannot share the engine's venv (verl pins transformers below the engine's, OpenRLHF
pins CUDA-only builds), so they run from `.venv-trainers`, built by tests/support/trainers_env.py
(`.ci/run` does). In an environment without the trainers this folder is not collected: run it
with `.venv-trainers/bin/python -m pytest tests/trainers`.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from grm_service.tiny_models import ensure_tiny_model
from tests.support.engines import COMPUTE_REPEATS
from tests.support.procs import Proc, gateway_on_stubs

TRAINERS = ("trl", "verl", "openrlhf")
PRESENT = all(importlib.util.find_spec(name) for name in TRAINERS)
if not PRESENT:
    collect_ignore_glob = ["test_*.py"]

# The trainers' own warnings (the suite turns warnings into errors), each by its text.
THEIR_WARNINGS = (
    "ignore:Ray state API is no longer experimental:DeprecationWarning",
)


def pytest_configure(config: pytest.Config) -> None:
    for line in THEIR_WARNINGS if PRESENT else ():
        config.addinivalue_line("filterwarnings", line)


SCORERS = ("trainer=tests.support.scoring:trainer_score,"
           "groupshape=tests.support.scoring:group_shape_score")
KEY = "trainer-key"


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, list[Proc]]]:
    """A keyed gateway on two recording STUB replicas with the `trainer` scorer
    (tests/support/scoring); every item reaches a replica once (none is answered from the
    ledger, none re-run by the audit), so a test can count what the engine was sent."""
    env = {"GRM_SCORERS": SCORERS, "GRM_API_KEYS": KEY, "GRM_AUDIT_FRACTION": "0",
           **COMPUTE_REPEATS}
    with gateway_on_stubs(tmp_path_factory.mktemp("trainers"), env=env,
                          stub_args=("--record", "100000")) as pair:
        yield pair


@pytest.fixture(scope="session")
def gateway(served: tuple[Proc, list[Proc]]) -> Proc:
    return served[0]


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built by this environment's transformers, in a cache of its own: the engine tests' cache
    # holds models written by the engine venv's (newer) transformers.
    return ensure_tiny_model("text", tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    # verl's worker takes the thread's current loop (or makes one); give it one to own.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()
