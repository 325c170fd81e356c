"""NeMo Gym's own client against the service: nemo-gym from PyPI, in its own environment.

Every nemo-gym release needs Python >= 3.12, so these tests run from `.venv-gym` (Python 3.12),
built by tests/support/gym_env.py (`.ci/run` does). In an environment without nemo-gym this
folder is not collected: run it with `.venv-gym/bin/python -m pytest tests/gym`. The gateway
runs from the same environment, on STUB replicas: what is under test is Gym's side of the wire;
the same client on the tiny model is tests/integration/test_gym_engine.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator

import pytest

from tests.support.engines import COMPUTE_REPEATS
from tests.support.procs import Proc, gateway_on_stubs

PRESENT = importlib.util.find_spec("nemo_gym") is not None
if not PRESENT:
    collect_ignore_glob = ["test_*.py"]

SCORERS = "trainer=tests.support.scoring:trainer_score,broken=tests.support.scoring:broken_score"


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, list[Proc]]]:
    """A gateway on two recording STUB replicas, `/verify` scored by the `trainer` scorer
    (tests/support/scoring): one chat call through a replica per rollout, every one computed
    (none from the ledger, none re-run by the audit)."""
    env = {"GRM_SCORERS": SCORERS, "GRM_VERIFY_SCORER": "trainer", "GRM_AUDIT_FRACTION": "0",
           **COMPUTE_REPEATS}
    with gateway_on_stubs(tmp_path_factory.mktemp("gym"), env=env,
                          stub_args=("--record", "100000")) as pair:
        yield pair


@pytest.fixture(scope="session")
def gateway(served: tuple[Proc, list[Proc]]) -> Proc:
    return served[0]


@pytest.fixture(scope="session")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for every Gym call of the run: Gym's client is one aiohttp session per
    process (`server_utils.set_global_aiohttp_client`), bound to the loop that made it."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()
