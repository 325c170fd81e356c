"""OpenRLHF 0.11's own remote-reward code (SingleTurnAgentExecutor: it decodes prompt + response
with the special tokens kept, posts to `--reward.remote_url` and reads the answer) against the
gateway's `/openrlhf/reward`. The policy's vLLM engine is replaced by a fixed-answer double: the
rollout is not under test, the reward call is."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from openrlhf.utils.agent import SingleTurnAgentExecutor
from transformers import AutoTokenizer

from tests.support.procs import Proc
from tests.trainers.conftest import KEY

pytestmark = pytest.mark.trainers


class PolicyEngine:
    """Answers every prompt with `answer` then EOS, as token ids (vLLM's output shape)."""

    def __init__(self, tokenizer: Any, answer: str) -> None:
        self.ids = [*tokenizer.encode(answer, add_special_tokens=False), tokenizer.eos_token_id]

    async def generate(self, prompt_ids: list[int], params: Any, multi_modal_data: Any = None
                       ) -> Any:
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(self.ids),
                                                        finish_reason="stop", logprobs=None)])


def remote_url(gateway: Proc, query: str, key: str | None = KEY) -> str:
    base = gateway.url.replace("http://", f"http://grm:{key}@") if key else gateway.url
    return f"{base}/openrlhf/reward?{query}"


def rollout(url: str, tokenizer: Any, question: str, answer: str, label: str
            ) -> dict[str, Any]:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                           tokenize=False, add_generation_prompt=True)
    executor = SingleTurnAgentExecutor(remote_rm_url=url)
    params = SimpleNamespace(max_tokens=16, logprobs=None)
    result: dict[str, Any] = asyncio.run(executor.execute(
        prompt, label, params, 256, tokenizer, PolicyEngine(tokenizer, answer)))
    return result


@pytest.fixture(scope="module")
def tokenizer(tiny_policy: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(tiny_policy))


def test_special_tokens_are_stripped_before_scoring(gateway: Proc, tokenizer: Any) -> None:
    stripped = rollout(remote_url(gateway, "scorer=trainer"), tokenizer, "2+2?", "4", "4")
    kept = rollout(remote_url(gateway, "scorer=trainer&special_tokens=keep"), tokenizer,
                   "2+2?", "4", "4")

    assert stripped["reward"] == [1.0] and stripped["scores"] == [1.0]
    assert stripped["extra_logs"] == {"grm_error": [0.0]}
    # What OpenRLHF sent ends in the template's end-of-turn token: kept, "4" is not the answer.
    assert kept["reward"] != [1.0] and kept["extra_logs"] == {"grm_error": [0.0]}


def test_failed_item_is_a_flagged_reward_not_a_failed_call(gateway: Proc,
                                                           tokenizer: Any) -> None:
    default = rollout(remote_url(gateway, "scorer=trainer"), tokenizer, "FAIL now", "4", "4")
    chosen = rollout(remote_url(gateway, "scorer=trainer&error_reward=-1"), tokenizer,
                     "FAIL now", "4", "4")

    assert (default["reward"], default["extra_logs"]) == ([0.0], {"grm_error": [1.0]})
    assert (chosen["reward"], chosen["extra_logs"]) == ([-1.0], {"grm_error": [1.0]})


def test_batch_request_with_per_item_errors(gateway: Proc, tokenizer: Any) -> None:
    executor = SingleTurnAgentExecutor(remote_rm_url=remote_url(gateway, "scorer=trainer"))
    prompts = ["<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\nFAIL<|im_end|>\n<|im_start|>assistant\n"]
    queries = [prompts[0] + "4<|im_end|>", prompts[1] + "4<|im_end|>"]

    (answer,) = asyncio.run(executor._fetch_rewards_via_http(queries, prompts, ["4", "4"]))

    assert answer["rewards"] == [1.0, 0.0] == answer["scores"]
    assert answer["extra_logs"] == {"grm_error": [0.0, 1.0]}
    assert answer["grm_errors"][0] is None and "asked this item to fail" in answer["grm_errors"][1]


def test_without_the_key_openrlhf_gets_no_reward(gateway: Proc, tokenizer: Any) -> None:
    # 401 five times (OpenRLHF retries a second apart), then it records no reward.
    refused = rollout(remote_url(gateway, "scorer=trainer", key=None), tokenizer, "2+2?", "4",
                      "4")

    assert refused["reward"] is None and refused["extra_logs"] == {}


def test_a_special_tokens_list_survives_openrlhfs_comma_split(gateway: Proc,
                                                                tokenizer: Any) -> None:
    # train_ppo_ray.py: `args.reward.remote_url = args.reward.remote_url.split(",")`.
    listed = remote_url(gateway, "scorer=trainer&special_tokens=<|im_end|>+<|endoftext|>")
    repeated = remote_url(gateway, "scorer=trainer&special_tokens=<|im_end|>"
                                   "&special_tokens=<|endoftext|>")
    for url in (listed, repeated):
        endpoints = url.split(",")
        assert len(endpoints) == 1
        executor = SingleTurnAgentExecutor(remote_rm_url=endpoints)
        prompt = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
        queries = [prompt + "4<|im_end|><|endoftext|>"]
        (answer,) = asyncio.run(executor._fetch_rewards_via_http(queries, [prompt], ["4"]))
        assert answer["rewards"] == [1.0], url


def test_a_url_openrlhf_would_cut_is_refused(gateway: Proc) -> None:
    # Posted as a whole (a curl check before training), the comma URL is refused by name.
    url = remote_url(gateway, "scorer=trainer&special_tokens=<|im_end|>,<|endoftext|>", key=None)
    answer = httpx.post(url, json={"query": ["4"]}, headers={"authorization": f"Bearer {KEY}"})
    assert answer.status_code == 400 and "splits --reward.remote_url on commas" in answer.text
