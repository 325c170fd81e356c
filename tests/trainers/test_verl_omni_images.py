"""verl-omni's image rewards beyond OCR: `compute_score_clip` and `compute_score_reward_head` in
the call shape of its `VisualRewardManager`, and the multi-reward recipe of docs/images.md (OCR
and `clip`, each on its own deployment: one gateway per model, one `url` each) through the
stand-in of its `MultiVisualRewardManager` (standin/), bitwise over two independent runs.

The replicas are recording STUBs. The `clip` deployment's gateway serves a STAND-IN `clip`
scorer (tests/support/scoring `clip_standin_score`, one request with the image and the prompt,
a score read from the stub's answer to those bytes); `reward_head` is the built-in scorer, which
the stubs' fixed /classify answer (0.25, 0.75) feeds. The engines' bits are the engine tests'.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from verl.experimental.reward_loop import RewardLoopWorker

from grm_service.integrations import verl_omni
from grm_service.scoring.ocr import ocr_score
from tests.support.engines import COMPUTE_REPEATS
from tests.support.procs import Proc, gateway_on_stubs, received
from tests.trainers.conftest import KEY
from tests.trainers.test_verl import verl_config
from tests.trainers.test_verl_omni import MULTI, TEXTS, image_batch, images, trainer

pytestmark = pytest.mark.trainers

ROOT = Path(__file__).resolve().parents[2]
ENTRY = "+reward.reward_functions"


@pytest.fixture(scope="module")
def clip_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, list[Proc]]]:
    """The `clip` deployment: a gateway of its own on two recording STUB replicas."""
    env = {"GRM_SCORERS": "clip=tests.support.scoring:clip_standin_score",
           "GRM_API_KEYS": KEY, "GRM_AUDIT_FRACTION": "0", **COMPUTE_REPEATS}
    with gateway_on_stubs(tmp_path_factory.mktemp("clip"), env=env,
                          stub_args=("--record", "100000")) as pair:
        yield pair


@pytest.fixture
def loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[asyncio.AbstractEventLoop]:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "standin"))
    monkeypatch.setenv("GRM_API_KEY", KEY)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


def prompts_sent(stubs: list[Proc]) -> list[str]:
    """The text part of each chat body the replicas were sent since the last look."""
    bodies = [r["body"] for r in received(stubs) if str(r["path"]).endswith("/completions")]
    received(stubs, clear=True)
    return [b["messages"][0]["content"][-1]["text"] for b in bodies]  # type: ignore[index]


def test_clip_adapter_scores_the_image_against_ground_truth(
    clip_served: tuple[Proc, list[Proc]], loop: asyncio.AbstractEventLoop
) -> None:
    gateway, stubs = clip_served
    received(stubs, clear=True)
    chw = images()[0]

    async def both() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        plain = await verl_omni.compute_score_clip("pick", chw, "a red fox", {}, url=gateway.url)
        scaled = await verl_omni.compute_score_clip("pick", chw, "a red fox", {},
                                                    url=gateway.url, scale=0.5)
        other = await verl_omni.compute_score_clip("pick", chw, ["a blue fox"], {},
                                                   url=gateway.url)
        await verl_omni.close_clients()
        return plain, scaled, other

    plain, scaled, other = loop.run_until_complete(both())
    assert plain["grm_error"] == 0.0 and plain["grm_fingerprint"].startswith("grm-")
    assert plain["score"] == plain["grm_raw"] and scaled["score"] == plain["score"] * 0.5
    assert other["score"] != plain["score"], "the prompt is scored"
    assert prompts_sent(stubs) == ["a red fox", "a red fox", "a blue fox"]


def test_reward_head_adapter_reads_the_head_raw(
    served: tuple[Proc, list[Proc]], loop: asyncio.AbstractEventLoop
) -> None:
    gateway, stubs = served
    received(stubs, clear=True)
    chw = images()[0]

    async def calls() -> list[dict[str, Any]]:
        answers = [await verl_omni.compute_score_reward_head("hps", chw, "a fox", {},
                                                             url=gateway.url, options=options)
                   for options in (None, {"head": "hpsv3", "scale": 2}, {"label": 1})]
        await verl_omni.close_clients()
        return answers

    default, hpsv3, sigma = loop.run_until_complete(calls())
    # The STUB's /classify answers (0.25, 0.75) raw: mu 0.25, sigma 0.75.
    assert (default["score"], hpsv3["score"], sigma["score"]) == (0.25, 0.5, 0.75)
    assert json.loads(default["genrm_response"]) == [0.25, 0.75]
    sent = [r["body"] for r in received(stubs) if r["path"] == "/classify"]
    assert len(sent) == 3 and all(b["use_activation"] is False for b in sent)  # type: ignore[index]
    assert sent[0]["messages"][0]["content"][1] == {"type": "text", "text": "a fox"}  # type: ignore[index]


def multi_recipe(ocr: Proc, clip: Proc) -> list[str]:
    """docs/images.md's recipe: OCR and PickScore-shaped `clip`, one gateway each."""
    return [*MULTI,
            f"{ENTRY}.ocr.path=pkg://grm_service.integrations.verl_omni",
            f"{ENTRY}.ocr.name=compute_score_ocr", f"{ENTRY}.ocr.weight=0.5",
            f"{ENTRY}.ocr.url={ocr.url}", f"{ENTRY}.ocr.full_determinism=true",
            f"{ENTRY}.ocr.seed=42", f"{ENTRY}.ocr.required=true",
            f"{ENTRY}.pickscore.path=pkg://grm_service.integrations.verl_omni",
            f"{ENTRY}.pickscore.name=compute_score_clip", f"{ENTRY}.pickscore.weight=0.5",
            f"{ENTRY}.pickscore.url={clip.url}", f"{ENTRY}.pickscore.required=true"]


def run_multi(config: Any, truths: list[str]) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    """A fresh reward worker scores the batch: verl-omni's `rm_scores` and the extra info."""
    worker = RewardLoopWorker(config)
    assert type(worker.reward_manager).__name__ == "MultiVisualRewardManager"
    data = image_batch(truths)
    outputs = worker.loop.run_until_complete(worker.compute_score_batch(data))
    worker.loop.run_until_complete(verl_omni.close_clients())
    scores = type(worker.reward_manager).assemble_rm_scores(
        data, [o["reward_score"] for o in outputs])
    return scores, [o["reward_extra_info"] for o in outputs]


def test_multi_reward_ocr_plus_clip_two_deployments_bitwise(
    served: tuple[Proc, list[Proc]], clip_served: tuple[Proc, list[Proc]], tiny_policy: Path,
    loop: asyncio.AbstractEventLoop,
) -> None:
    (ocr_gateway, ocr_stubs), (clip_gateway, clip_stubs) = served, clip_served
    docs = (ROOT / "docs" / "images.md").read_text()
    lines = multi_recipe(ocr_gateway, clip_gateway)
    documented = [line.split("=", 1)[0] for line in lines]
    assert all(key in docs for key in documented), "docs/images.md gives every line"
    config = verl_config([*trainer(tiny_policy), *lines])
    received(ocr_stubs, clear=True), received(clip_stubs, clear=True)

    first, info = run_multi(config, TEXTS)
    second, again = run_multi(config, TEXTS)

    assert torch.equal(first, second) and info == again, "two runs, the same bits"
    assert len(set(first.flatten().tolist())) == len(TEXTS), "the rewards differ by image"
    for reward, extra, text in zip(first.flatten().tolist(), info, TEXTS, strict=True):
        assert extra["reward/ocr"] == ocr_score(extra["reward/ocr/genrm_response"], text)
        assert extra["reward/pickscore"] == extra["reward/pickscore/grm_raw"]
        # The manager's sum, in the entries' order, is what the trainer gets (as float32).
        combined = 0.0 + 0.5 * extra["reward/ocr"] + 0.5 * extra["reward/pickscore"]
        assert extra["reward/combined"] == combined
        assert reward == torch.tensor(combined, dtype=torch.float32).item()
    ocr_paths = {str(r["path"]) for r in received(ocr_stubs)}
    clip_prompts = prompts_sent(clip_stubs)
    assert ocr_paths == {"/v1/chat/completions"}, "each deployment got its own model's work"
    assert sorted(clip_prompts) == sorted(TEXTS * 2), "ground_truth is the clip prompt"
