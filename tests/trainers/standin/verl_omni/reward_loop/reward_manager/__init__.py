"""Stand-in for `verl_omni.reward_loop.reward_manager`, the module path verl-omni's reward config
names (`reward.reward_manager.module.path`)."""

from .multi import MultiVisualRewardManager
from .visual import VisualRewardManager

__all__ = ["MultiVisualRewardManager", "VisualRewardManager"]
