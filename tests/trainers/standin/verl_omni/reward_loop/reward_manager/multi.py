"""Stand-in for verl-omni's `MultiVisualRewardManager`: the entries of `reward.reward_functions`,
each loaded from its `path` and `name`, called with the keywords its signature declares (its
entry's other keys included), weighted and summed in the entries' order."""

from __future__ import annotations

import inspect
import logging
from typing import Any

from verl import DataProto
from verl.utils.import_utils import load_extern_object

from .visual import VisualRewardManager, sample_kwargs, split

logger = logging.getLogger(__name__)
RESERVED = ("path", "name", "weight", "required")


def _multi_reward_placeholder(**kwargs: Any) -> Any:
    """What `reward.custom_reward_function` names for this manager; never called."""
    raise RuntimeError("_multi_reward_placeholder is never called")


def declared(kwargs: dict[str, Any], function: Any) -> dict[str, Any]:
    """The keywords `function` declares, or all of them where it takes **kwargs."""
    params = inspect.signature(function).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def required_of(value: Any) -> bool:
    """An entry's `required`: a bool, or the text "true"/"false" as a command line gives it."""
    if isinstance(value, str):
        if value.lower() not in ("true", "false"):
            raise ValueError(f"Invalid required value: {value!r}")
        return value.lower() == "true"
    if isinstance(value, bool):
        return value
    raise TypeError(f"required must be a boolean, got {type(value).__name__}")


class MultiVisualRewardManager(VisualRewardManager):
    def __init__(self, config: Any, tokenizer: Any, compute_score: Any,
                 reward_router_address: str | None = None,
                 reward_model_tokenizer: Any = None) -> None:
        super().__init__(config, tokenizer, _multi_reward_placeholder, reward_router_address,
                         reward_model_tokenizer)
        entries = config.reward.reward_functions
        if not entries:
            raise ValueError("MultiVisualRewardManager requires non-empty reward.reward_functions")
        self.entries = [
            (key, load_extern_object(entry["path"], entry["name"]),
             float(entry.get("weight", 1.0)), required_of(entry.get("required", False)),
             {k: v for k, v in entry.items() if k not in RESERVED})
            for key, entry in entries.items()
        ]
        total = sum(weight for _, _, weight, _, _ in self.entries)
        if total <= 0:
            raise ValueError(f"Total weight of reward functions must be > 0, got {total}")

    async def one(self, function: Any, kwargs: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(function):
            return await function(**kwargs)
        return await self.loop.run_in_executor(None, lambda: function(**kwargs))

    async def run_single(self, data: DataProto) -> dict[str, Any]:
        shared = {**sample_kwargs(data), **self.router_kwargs()}
        combined, info = 0.0, {}
        for key, function, weight, required, own in self.entries:
            try:
                result = await self.one(function, declared({**shared, **own}, function))
                if isinstance(result, dict):
                    info.update({f"reward/{key}/{k}": v for k, v in split(result)[1].items()})
                    result = result["score"]
                score = float(result)
            except Exception as err:
                if required:
                    raise RuntimeError(f"Required sub-reward '{key}' failed: {err}") from err
                logger.error("Sub-reward %r failed: %s; it adds 0", key, err)
                score = 0.0
            info[f"reward/{key}"] = score
            combined += weight * score
        info["reward/combined"] = combined
        return {"reward_score": combined, "reward_extra_info": info}
