"""verl's per-sample reward calls with each sample's group: its `uid` and `rollout.n`.

verl 0.9's reward loop calls the reward function once per sample, as each rollout finishes, on any
reward loop worker: `compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`
(its naive reward manager's `run_single`). The sample's group id, `uid` (one per prompt and
step, shared by its `actor_rollout_ref.rollout.n` samples), is in the sample's DataProto
(`non_tensor_batch["uid"]`), not among those arguments. `GroupRewardManager` is verl's naive
reward manager that first puts `group_id` (the uid) and `group_size` (rollout.n) into the
sample's `extra_info`; verl.py's `compute_score` sends them with the item:

    reward.reward_manager.source=importlib
    reward.reward_manager.name=GroupRewardManager
    reward.reward_manager.module.path=pkg://grm_service.integrations.verl_groups

verl is imported only when verl itself asks this module for the class (it is there then): the
client distribution, which carries this module, does not depend on verl.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from grm_service.integrations.verl import GROUP_ID, GROUP_SIZE

MANAGER = "GroupRewardManager"


def with_groups(data: Any, size: int) -> None:
    """Put each sample's group into its `extra_info`, a dict of its own: verl's `repeat` leaves
    the samples of one prompt sharing one dict."""
    rows = data.non_tensor_batch
    uids = rows["uid"]
    infos = rows.get("extra_info")
    if infos is None:
        infos = rows["extra_info"] = uids.copy()  # an object array of the batch's length
        for i in range(len(infos)):
            infos[i] = {}
    for i, uid in enumerate(uids):
        infos[i] = {**(infos[i] or {}), GROUP_ID: str(uid), GROUP_SIZE: size}


@functools.cache
def _manager() -> type:
    naive: Any = importlib.import_module(
        "verl.experimental.reward_loop.reward_manager").NaiveRewardManager

    async def run_single(self: Any, data: Any) -> Any:
        with_groups(data, int(self.config.actor_rollout_ref.rollout.n))
        return await naive.run_single(self, data)

    return type(MANAGER, (naive,), {"run_single": run_single, "__module__": __name__,
                                    "__doc__": "verl's naive reward manager, with each "
                                               "sample's group in its extra_info."})


def __getattr__(name: str) -> Any:
    if name == MANAGER:
        return _manager()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
