"""`GroupRewardManager`, as verl's importlib loader gets it (`getattr` on the module), over a
stand-in for verl's naive reward manager: verl is not installed here, and the class is built
only when asked for. tests/trainers/test_verl_groups.py runs it in verl itself."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from grm_service.integrations import verl_groups

NAIVE_MODULE = "verl.experimental.reward_loop.reward_manager"


class Rows:
    """What the manager reads of a verl DataProto: its `non_tensor_batch`."""

    def __init__(self, non_tensor_batch: dict[str, np.ndarray]) -> None:
        self.non_tensor_batch = non_tensor_batch


class NaiveRewardManager:
    """verl's naive manager as far as the group manager uses it: its `config`, and a
    `run_single` that scores one sample (here: records the extra_info it was given)."""

    def __init__(self, n: Any) -> None:
        rollout = types.SimpleNamespace(n=n)
        self.config = types.SimpleNamespace(actor_rollout_ref=types.SimpleNamespace(
            rollout=rollout))
        self.seen: list[list[dict[str, Any]]] = []

    async def run_single(self, data: Rows) -> dict[str, Any]:
        self.seen.append(list(data.non_tensor_batch["extra_info"]))
        return {"reward_score": 1.0}


@pytest.fixture
def manager_built_anew() -> Iterator[None]:
    # The class is built once per process: each test builds it over its own stand-in, and
    # leaves none behind for a later lookup.
    verl_groups._manager.cache_clear()
    yield
    verl_groups._manager.cache_clear()


@pytest.fixture
def verl_naive(monkeypatch: pytest.MonkeyPatch, manager_built_anew: None) -> None:
    module = types.ModuleType(NAIVE_MODULE)
    module.NaiveRewardManager = NaiveRewardManager  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, NAIVE_MODULE, module)


async def test_the_manager_puts_each_samples_group_in_then_scores_as_naive_does(
        verl_naive: None) -> None:
    """verl's loader (source=importlib) takes the class by name from the module."""
    manager_class = getattr(importlib.import_module(verl_groups.__name__), verl_groups.MANAGER)
    assert manager_class.__name__ == "GroupRewardManager"
    assert manager_class.__module__ == "grm_service.integrations.verl_groups"
    assert manager_class.__mro__[1] is NaiveRewardManager
    assert verl_groups.GroupRewardManager is manager_class

    manager = manager_class(np.int64(2))  # rollout.n as a config may hold it
    shared = {"index": 0}
    data = Rows({"uid": np.array(["u1", "u1"], dtype=object),
                 "extra_info": np.array([shared, shared], dtype=object)})
    assert await manager.run_single(data) == {"reward_score": 1.0}
    assert manager.seen == [[{"index": 0, "group_id": "u1", "group_size": 2}] * 2]
    assert type(manager.seen[0][0]["group_size"]) is int  # sent as JSON: not a numpy int
    assert shared == {"index": 0}


def test_without_verl_only_asking_for_the_class_fails(
        monkeypatch: pytest.MonkeyPatch, manager_built_anew: None) -> None:
    """The client distribution imports the module (above, at collection) without verl."""
    monkeypatch.setitem(sys.modules, NAIVE_MODULE, None)  # as where verl is not installed
    with pytest.raises(ModuleNotFoundError, match="verl"):
        _ = verl_groups.GroupRewardManager
