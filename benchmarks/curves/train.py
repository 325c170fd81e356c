"""One training run of reward_curves.py: TRL's GRPOTrainer on the tiny policy, every reward kept.

The policy is built by this interpreter's transformers (the trainers' release), in a cache of
its own, as tests/trainers does: the engines' venv writes models with a newer transformers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grm_service.tiny_models import default_cache_dir, ensure_tiny_model

PROMPTS = [
    ("What is 2+2?", "4"), ("Name a colour.", "red"), ("Say hi.", "hi"),
    ("What is the capital of France?", "Paris"), ("Count to three.", "1 2 3"),
    ("Spell cat.", "c a t"), ("What is 10 minus 3?", "7"), ("Name a fruit.", "apple"),
    ("What day comes after Monday?", "Tuesday"), ("What is 3 times 3?", "9"),
    ("Name a planet.", "Mars"), ("Opposite of hot?", "cold"), ("What is 5+6?", "11"),
    ("Name an animal.", "dog"), ("Square root of 16?", "4"), ("First letter of the alphabet?", "a"),
]
# 16 completions a step: 4 prompts, 4 generations each.
TRAINER_ARGS: dict[str, Any] = {
    "per_device_train_batch_size": 16, "num_generations": 4, "max_completion_length": 16,
    "learning_rate": 1e-3, "seed": 0,
}


class Disruption:
    """What happens to the replicas during a run: `kill` before one step, `back` (wait until the
    killed replica serves again) before a later one."""

    def kill(self) -> None:
        raise NotImplementedError

    def back(self) -> None:
        raise NotImplementedError


@dataclass
class Curve:
    steps: list[dict[str, Any]] = field(default_factory=list)


class Recorded:
    """A reward function that keeps what it returned, with a digest of what it scored."""

    def __init__(self, fn: Callable[..., list[float | None]], curve: Curve) -> None:
        self.fn, self.curve = fn, curve
        self.__name__ = getattr(fn, "__name__", "judge")

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 **columns: Any) -> list[float | None]:
        out = self.fn(prompts=prompts, completions=completions, **columns)
        digest = hashlib.sha256(json.dumps(list(completions)).encode()).hexdigest()[:16]
        self.curve.steps.append({"completions": digest,
                                 "rewards": [None if r is None else float(r).hex() for r in out]})
        return out


def policy() -> Path:
    return ensure_tiny_model("text", default_cache_dir().parent / "tiny-models-trainers")


def train(reward: Callable[..., list[float | None]], args: argparse.Namespace,
          disruption: Disruption | None) -> Curve:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class Disrupt(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, _args: Any, state: Any, _control: Any, **_: Any) -> None:
            step = state.global_step + 1
            if disruption is not None and step == args.kill_step:
                disruption.kill()
            if disruption is not None and step == args.back_step:
                disruption.back()

    curve = Curve()
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p, _ in PROMPTS],
                                 "reference": [r for _, r in PROMPTS]})
    with tempfile.TemporaryDirectory(prefix="reward-curves-") as out:
        config = GRPOConfig(output_dir=out, max_steps=args.steps, logging_steps=1,
                            report_to=[], use_cpu=True, bf16=False, save_strategy="no",
                            dataloader_num_workers=0, disable_tqdm=True, **TRAINER_ARGS)
        trainer = GRPOTrainer(model=str(policy()), reward_funcs=[Recorded(reward, curve)],
                              args=config, train_dataset=dataset, callbacks=[Disrupt()])
        trainer.train()
    return curve
