"""Stand-in for verl-omni's `VisualRewardManager` (its determinism pull request, #115, which adds
`sampling_params`): one generated image or video per call of the reward function, by keyword."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase


def sample_kwargs(data: DataProto) -> dict[str, Any]:
    """The sample's keywords: its pixels as the rollout left them (uint8), and its metadata."""
    assert len(data) == 1, "one sample per call, as verl-omni's manager asserts"
    item = data[0]
    if item.batch["responses"].dtype != torch.uint8:  # verl-omni's check of an image rollout
        raise ValueError(f"Expected uint8 pixel responses, got {item.batch['responses'].dtype}.")
    extra_info = item.non_tensor_batch.get("extra_info", {})
    tool_extra_fields = item.non_tensor_batch.get("tool_extra_fields", None)
    if tool_extra_fields is not None:
        extra_info.update(tool_extra_fields.items())
    extra_info["num_turns"] = item.non_tensor_batch.get("__num_turns__", None)
    extra_info["rollout_reward_scores"] = item.non_tensor_batch.get("reward_scores", {})
    return {"data_source": item.non_tensor_batch["data_source"],
            "solution_image": item.batch["responses"],
            "ground_truth": item.non_tensor_batch["reward_model"]["ground_truth"],
            "extra_info": extra_info}


def split(result: Any) -> tuple[float, dict[str, Any]]:
    """A reward function's answer: the score, and every other key of a dict answer."""
    if isinstance(result, dict):
        return result["score"], {k: v for k, v in result.items() if k != "score"}
    return result, {"acc": result}


class VisualRewardManager(RewardManagerBase):  # type: ignore[misc]
    def __init__(self, config: Any, tokenizer: Any, compute_score: Any,
                 reward_router_address: str | None = None,
                 reward_model_tokenizer: Any = None) -> None:
        super().__init__(config, tokenizer, compute_score)
        self.compute_score = compute_score
        self.is_async_reward_score = inspect.iscoroutinefunction(compute_score)
        self.reward_router_address = reward_router_address
        self.reward_model_tokenizer = reward_model_tokenizer

    @classmethod
    def assemble_rm_scores(cls, data: DataProto, scores: list[float]) -> torch.Tensor:
        """`rm_scores`: one float32 reward per sample, shape (batch, 1)."""
        return torch.tensor(scores, dtype=torch.float32).unsqueeze(-1)

    def router_kwargs(self) -> dict[str, Any]:
        """What the reward function also gets once a reward model is configured."""
        if self.reward_router_address is None:
            return {}
        return {"reward_router_address": self.reward_router_address,
                "reward_model_tokenizer": self.reward_model_tokenizer,
                "model_name": self.config.reward.reward_model.model_path}

    def sampling_params(self) -> dict[str, Any]:
        """The reward model's sampling, and the seed once `reward_model.full_determinism`."""
        model = self.config.reward.reward_model
        params = {"temperature": model.rollout.temperature, "top_k": model.rollout.top_k,
                  "top_p": model.rollout.top_p,
                  "max_tokens": model.rollout.get("response_length", None) or 4096}
        if model.get("full_determinism", False):
            params["seed"] = model.get("seed", 42)
        return params

    async def call(self, **kwargs: Any) -> Any:
        if self.is_async_reward_score:
            return await self.compute_score(**kwargs)
        return await self.loop.run_in_executor(None, lambda: self.compute_score(**kwargs))

    async def run_single(self, data: DataProto) -> dict[str, Any]:
        extra = self.router_kwargs()
        if extra:
            extra["sampling_params"] = self.sampling_params()
        score, info = split(await self.call(**sample_kwargs(data), **extra))
        return {"reward_score": score, "reward_extra_info": info}
