"""verl's own GenRM route: `reward_router_address` pointed at grm-service, configured as
docs/integrations.md says.

verl's GenRM reward functions (its reward-loop docs and tests, verl-omni's `genrm_ocr`) POST
`http://{reward_router_address}/v1/chat/completions` with `"model": <model path>` and parse the
answer with `openai`'s `ChatCompletion`. verl's wheel ships none of them, so
`compute_score_gsm8k` below is this project's stand-in for the one in verl's reward-loop docs and
tests: the same signature (`reward_router_address` and `reward_model_tokenizer` required), the
same request and parse, the same answer. verl's own `RewardLoopWorker` loads it by `pkg://` and
calls it through verl's naive reward manager, with `reward_kwargs` merged over its keywords.
The gateway serves the model under the path the function sends (`--served-model-name`).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai.types.chat import ChatCompletion
from transformers import AutoTokenizer, PreTrainedTokenizer
from verl.experimental.reward_loop import RewardLoopWorker

from tests.support.procs import Proc, gateway_on_stubs, received
from tests.trainers.test_verl import batch, verl_config

pytestmark = pytest.mark.trainers

ROOT = Path(__file__).resolve().parents[2]
MODEL_PATH = "/models/genrm-1.5b"
FN = "reward.custom_reward_function"
GRM_PROMPT_TEMPLATE = "Problem:\n{problem}\n\nSolution:\n{solution}\n\nScore 1-10 as one integer."


async def chat_complete(router_address: str, chat_complete_request: dict[str, Any]) -> Any:
    url = f"http://{router_address}/v1/chat/completions"
    async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session,
                session.post(url, json=chat_complete_request) as resp):
        return ChatCompletion(**json.loads(await resp.text()))


async def compute_score_gsm8k(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any],
    reward_router_address: str,
    reward_model_tokenizer: PreTrainedTokenizer,
) -> dict[str, Any]:
    grm_prompt = GRM_PROMPT_TEMPLATE.format(problem=extra_info["question"], solution=solution_str)
    messages = [{"role": "user", "content": grm_prompt}]
    sampling_params = {"temperature": 0.7, "top_p": 0.8, "max_tokens": 4096}
    model_name = os.environ.get("GENRM_MODEL_NAME", os.path.expanduser("~/models/genrm"))
    result = await chat_complete(router_address=reward_router_address,
                                 chat_complete_request={"messages": messages,
                                                        "model": model_name,
                                                        **sampling_params})
    grm_response = result.choices[0].message.content
    try:
        score = int(grm_response.split("\n\n")[-1].strip())
    except ValueError:
        score = 0
    return {"score": score, "acc": score == 10, "genrm_response": grm_response}


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, list[Proc]]]:
    """An unkeyed gateway on recording STUB replicas, as a router on the trainer's private
    network."""
    with gateway_on_stubs(tmp_path_factory.mktemp("genrm"), "--served-model-name", MODEL_PATH,
                          stub_args=("--served-model-name", MODEL_PATH, "--record", "1000")
                          ) as pair:
        yield pair


def documented(router: Proc) -> list[str]:
    """docs/integrations.md's overrides for this route, the function and address filled in."""
    return [
        "reward.reward_model.enable=false",
        f"{FN}.path=pkg://tests.trainers.test_verl_genrm",
        f"{FN}.name=compute_score_gsm8k",
        f"+{FN}.reward_kwargs.reward_router_address={router.url.removeprefix('http://')}",
        f"+{FN}.reward_kwargs.reward_model_tokenizer=null",
    ]


@pytest.fixture
def genrm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENRM_MODEL_NAME", MODEL_PATH)  # how verl's function names its model


def test_verl_genrm_function_through_reward_router_address(
    router: tuple[Proc, list[Proc]], tiny_policy: Path, loop: asyncio.AbstractEventLoop,
    genrm_env: None,
) -> None:
    gateway, stubs = router
    docs = (ROOT / "docs" / "integrations.md").read_text()
    assert f"+{FN}.reward_kwargs.reward_model_tokenizer=null" in docs
    config = verl_config([f"actor_rollout_ref.model.path={tiny_policy}", *documented(gateway)])
    data = batch(AutoTokenizer.from_pretrained(str(tiny_policy)))
    received(stubs, clear=True)

    first = loop.run_until_complete(RewardLoopWorker(config).compute_score_batch(data))
    again = loop.run_until_complete(RewardLoopWorker(config).compute_score_batch(data))

    info = [o["reward_extra_info"] for o in first]
    assert all(i["genrm_response"].startswith("stub-") for i in info)
    assert info == [o["reward_extra_info"] for o in again]
    # The gateway's own checks (its audit re-sends a sample of requests) may add bodies.
    bodies: list[Any] = [r["body"] for r in received(stubs)]
    assert len(bodies) >= 6 and {b["model"] for b in bodies} == {MODEL_PATH}
    assert {b["seed"] for b in bodies} == {42}, "the gateway gave each request its seed"


def test_without_the_tokenizer_line_verls_function_is_not_called(
    router: tuple[Proc, list[Proc]], tiny_policy: Path, loop: asyncio.AbstractEventLoop,
    genrm_env: None,
) -> None:
    # verl passes reward_model_tokenizer only when it runs a reward model of its own.
    config = verl_config([f"actor_rollout_ref.model.path={tiny_policy}",
                          *documented(router[0])[:-1]])
    data = batch(AutoTokenizer.from_pretrained(str(tiny_policy)))
    with pytest.raises(TypeError, match="reward_model_tokenizer"):
        loop.run_until_complete(RewardLoopWorker(config).compute_score_batch(data))
