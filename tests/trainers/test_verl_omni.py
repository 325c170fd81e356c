"""verl's reward loop with verl-omni's reward managers calls `pkg://grm_service.integrations.verl_omni`
`compute_score_ocr` on generated pixels, configured with the overrides docs/integrations.md gives.

verl-omni is not on PyPI. `standin/` holds its two reward managers under verl-omni's own module
names (tests/trainers/standin/README.md): each keeps verl-omni's constructor and its call of the
reward function (`sampling_params` as verl-omni's determinism change, PR #115, passes it). verl
0.9's own `RewardLoopWorker` loads them by the `reward.reward_manager` settings verl-omni's config
has, and loads the adapter by `pkg://`. The gateway's `ocr` scorer runs on recording STUB
replicas, whose answers are derived from the request bytes (a seed included): their records show
what reached the engine. The determinism check of verl-omni's page is shaped after its own test;
on STUB replicas it proves the adapter's path, not an engine's bits (the engine tests do that).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from verl import DataProto
from verl.experimental.reward_loop import RewardLoopWorker

from grm_service.integrations import verl_omni
from grm_service.scoring.ocr import ocr_score
from tests.support.procs import Proc, received
from tests.trainers.conftest import KEY
from tests.trainers.test_verl import verl_config

pytestmark = pytest.mark.trainers

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["HELLO", "WORLD", "GRM"]
FN = "reward.custom_reward_function"
# verl-omni's reward config (its reward.yaml) where it differs from verl's: its manager.
VISUAL = ["reward.reward_manager.name=VisualRewardManager",
          "reward.reward_manager.module.path=pkg://verl_omni.reward_loop.reward_manager"]
# verl-omni's determinism switch, and its mapping to the function (docs/integrations.md).
SWITCH = "++reward.reward_model.rollout.full_determinism=true"
MAPPED = ["+{at}.full_determinism=${{reward.reward_model.rollout.full_determinism}}",
          "+{at}.seed=${{reward.reward_model.rollout.seed}}"]
# The four lines MultiVisualRewardManager needs (verl-omni's own multi-reward example).
MULTI = ["reward.reward_manager.name=MultiVisualRewardManager",
         "reward.reward_manager.module.path=pkg://verl_omni.reward_loop.reward_manager",
         f"{FN}.path=pkg://verl_omni.reward_loop.reward_manager.multi",
         f"{FN}.name=_multi_reward_placeholder"]


@pytest.fixture
def loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[asyncio.AbstractEventLoop]:
    """verl-omni's managers importable by their own names; the key in the environment; an
    event loop for verl's worker to own."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "standin"))
    monkeypatch.setenv("GRM_API_KEY", KEY)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


def trainer(policy: Path, reward_model: bool = False) -> list[str]:
    """verl's config made verl-omni's: its managers are found by importlib."""
    return [f"actor_rollout_ref.model.path={policy}", "reward.reward_manager.source=importlib",
            f"reward.reward_model.enable={str(reward_model).lower()}"]


def recipe(gateway: Proc, *more: str) -> list[str]:
    """docs/integrations.md's verl-omni recipe."""
    return [*VISUAL, f"{FN}.path=pkg://grm_service.integrations.verl_omni",
            f"{FN}.name=compute_score_ocr", f"+{FN}.reward_kwargs.url={gateway.url}", *more]


def switched(at: str, seed: int) -> list[str]:
    """The switch on with `seed`, mapped to the function's keywords at `at`."""
    return [SWITCH, f"++reward.reward_model.rollout.seed={seed}",
            *(line.format(at=at) for line in MAPPED)]


def images() -> torch.Tensor:
    """A rollout's generated images: uint8 (B, C, H, W), each distinct."""
    rng = np.random.default_rng(7)
    return torch.from_numpy(rng.integers(0, 256, (len(TEXTS), 3, 24, 32), dtype=np.uint8))


def image_batch(truths: list[str] = TEXTS) -> DataProto:
    return DataProto.from_dict(
        tensors={"responses": images()},
        non_tensors={
            "data_source": np.array(["ocr"] * len(truths), dtype=object),
            "reward_model": np.array([{"ground_truth": t} for t in truths], dtype=object),
            "extra_info": np.array([{"index": i} for i in range(len(truths))], dtype=object),
        },
    )


def score(worker: RewardLoopWorker, data: DataProto) -> list[dict[str, Any]]:
    outputs = worker.loop.run_until_complete(worker.compute_score_batch(data))
    worker.loop.run_until_complete(verl_omni.close_clients())
    return list(outputs)


def engine_bodies(stubs: list[Proc]) -> list[dict[str, Any]]:
    """The chat bodies the replicas were sent since the last look."""
    bodies = [r["body"] for r in received(stubs) if str(r["path"]).endswith("/completions")]
    received(stubs, clear=True)
    return bodies  # type: ignore[return-value]


def fingerprint_id(gateway: Proc) -> str:
    answer = httpx.get(gateway.url + "/v1/fingerprint", headers={"authorization": f"Bearer {KEY}"})
    return str(answer.json()["fingerprint_id"])


def test_reward_loop_scores_generated_images(
    served: tuple[Proc, list[Proc]], tiny_policy: Path, loop: asyncio.AbstractEventLoop
) -> None:
    gateway, stubs = served
    worker = RewardLoopWorker(verl_config([*trainer(tiny_policy), *recipe(gateway)]))
    assert type(worker.reward_manager).__name__ == "VisualRewardManager"
    received(stubs, clear=True)

    outputs = score(worker, image_batch())

    extra = [o["reward_extra_info"] for o in outputs]
    for output, info, text in zip(outputs, extra, TEXTS, strict=True):
        assert info["grm_error"] == 0.0 and info["genrm_response"].startswith("stub-")
        assert output["reward_score"] == ocr_score(info["genrm_response"], text)
    assert {e["grm_fingerprint"] for e in extra} == {fingerprint_id(gateway)}
    assert len({e["genrm_response"] for e in extra}) == len(TEXTS), "each image its own"
    assert [b["seed"] for b in engine_bodies(stubs)] == [42] * 3, "switch off: the service's"


def test_a_configured_reward_model_passes_its_sampling_and_seed(
    served: tuple[Proc, list[Proc]], tiny_policy: Path, loop: asyncio.AbstractEventLoop
) -> None:
    # A config moved over from verl-omni's genrm_ocr: a reward model of its own, its switch on.
    gateway, stubs = served
    config = verl_config([
        *trainer(tiny_policy, reward_model=True), *recipe(gateway),
        f"reward.reward_model.model_path={tiny_policy}",
        "reward.reward_model.rollout.response_length=64",
        "+reward.reward_model.full_determinism=true", "+reward.reward_model.seed=1234",
    ])
    worker = RewardLoopWorker(config, reward_router_address="127.0.0.1:9")  # its own router
    received(stubs, clear=True)

    outputs = score(worker, image_batch())

    assert all(o["reward_extra_info"]["grm_error"] == 0.0 for o in outputs)
    sent = [{k: b[k] for k in ("temperature", "top_k", "top_p", "max_tokens", "seed")}
            for b in engine_bodies(stubs)]
    assert sent == [{"temperature": 1.0, "top_k": -1, "top_p": 1, "max_tokens": 64,
                     "seed": 1234}] * 3


def test_the_documented_switch_reaches_the_engine(
    served: tuple[Proc, list[Proc]], tiny_policy: Path, loop: asyncio.AbstractEventLoop
) -> None:
    gateway, stubs = served
    config = verl_config([*trainer(tiny_policy),
                          *recipe(gateway, *switched(f"{FN}.reward_kwargs", 4321))])
    received(stubs, clear=True)

    outputs = score(RewardLoopWorker(config), image_batch())

    assert all(o["reward_extra_info"]["grm_error"] == 0.0 for o in outputs)
    assert [b["seed"] for b in engine_bodies(stubs)] == [4321] * 3


def run_with_seed(seed: int, gateway: Proc, policy: Path,
                  data: DataProto) -> tuple[torch.Tensor, list[str]]:
    """A fresh reward worker scores `data`: verl-omni's `rm_scores` and the transcripts."""
    config = verl_config([*trainer(policy),
                          *recipe(gateway, *switched(f"{FN}.reward_kwargs", seed))])
    worker = RewardLoopWorker(config)
    outputs = score(worker, data)
    responses = [o["reward_extra_info"]["genrm_response"] for o in outputs]
    scores = type(worker.reward_manager).assemble_rm_scores(data, [o["reward_score"]
                                                                   for o in outputs])
    return scores, responses


def test_same_seed_two_runs_same_rm_scores_bit_for_bit(
    served: tuple[Proc, list[Proc]], tiny_policy: Path, loop: asyncio.AbstractEventLoop
) -> None:
    # verl-omni's "Deterministic Post-Training" check: the same seed, two independent runs.
    gateway, stubs = served
    data = image_batch(["stub-0123456789abcdef"] * 3)  # a STUB transcript's length: scores vary
    received(stubs, clear=True)

    (first, said), (second, again) = (run_with_seed(42, gateway, tiny_policy, data)
                                      for _ in range(2))
    _, other_said = run_with_seed(43, gateway, tiny_policy, data)

    seeds = sorted(b["seed"] for b in engine_bodies(stubs))  # two replicas: in no one order
    assert seeds == [42] * 6 + [43] * 3, "each run reached a replica"
    assert torch.equal(first, second) and said == again
    assert first.shape == (3, 1) and first.dtype == torch.float32
    assert len(set(first.flatten().tolist())) > 1, "the rewards differ by image"
    assert not set(said) & set(other_said), "another seed, other transcripts"


def test_the_multi_reward_recipe(
    served: tuple[Proc, list[Proc]], tiny_policy: Path, loop: asyncio.AbstractEventLoop
) -> None:
    gateway, stubs = served
    docs = (ROOT / "docs" / "integrations.md").read_text()
    assert all(line in docs for line in MULTI), "the docs give the four lines"
    entry = "+reward.reward_functions.ocr"
    config = verl_config([
        *trainer(tiny_policy), *MULTI,
        f"{entry}.path=pkg://grm_service.integrations.verl_omni",
        f"{entry}.name=compute_score_ocr", f"{entry}.weight=0.5", f"{entry}.url={gateway.url}",
        *switched(entry[1:], 77),
    ])
    worker = RewardLoopWorker(config)
    assert type(worker.reward_manager).__name__ == "MultiVisualRewardManager"
    received(stubs, clear=True)

    outputs = score(worker, image_batch())

    for output, text in zip(outputs, TEXTS, strict=True):
        info = output["reward_extra_info"]
        assert info["reward/ocr/grm_error"] == 0.0
        assert info["reward/ocr"] == ocr_score(info["reward/ocr/genrm_response"], text)
        assert output["reward_score"] == info["reward/combined"] == 0.5 * info["reward/ocr"]
    assert [b["seed"] for b in engine_bodies(stubs)] == [77] * 3


def test_one_image_in_any_form_scores_the_same(
    gateway: Proc, loop: asyncio.AbstractEventLoop
) -> None:
    chw = images()[0]

    async def score(image: Any, **extra: Any) -> dict[str, Any]:
        return await verl_omni.compute_score_ocr("ocr", image, "HELLO", extra, url=gateway.url)

    forms = [chw, chw.permute(1, 2, 0).numpy(), chw.float() / 255.0]
    answers = [loop.run_until_complete(score(f)) for f in forms]
    # A video of 8 frames (T, C, H, W): every 4th frame is scored, 2 requests, the mean.
    video = loop.run_until_complete(score(torch.stack([chw] * 8), frame_interval=4))
    # One frame channels first, (C, F, H, W) with F = 1: the same RGB image.
    one = loop.run_until_complete(score(chw[:, None]))
    loop.run_until_complete(verl_omni.close_clients())

    assert answers[0] == answers[1] == answers[2] == one, "same pixels, same PNG, same answer"
    assert video["score"] == answers[0]["score"]
    assert video["genrm_response"] == answers[0]["genrm_response"]
