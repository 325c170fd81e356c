"""verl's own GenRM route: `reward_router_address` pointed at grm-service.

verl's GenRM reward functions (its reward-loop docs and tests, verl-omni's `genrm_ocr`) POST
`http://{reward_router_address}/v1/chat/completions` with `"model": <model path>` and parse the
text. `compute_score_genrm` below is this project's function of that shape (verl's wheel ships no
GenRM function); verl's own `RewardLoopWorker` loads it by `pkg://` and binds the router address
from `reward_kwargs`, which take precedence over verl's own. The gateway serves the model under
the path the function sends (`--served-model-name`) and answers with its fingerprint.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from transformers import AutoTokenizer
from verl.experimental.reward_loop import RewardLoopWorker

from tests.support.procs import Proc, gateway_on_stubs
from tests.trainers.test_verl import batch, verl_config

pytestmark = pytest.mark.trainers

MODEL_PATH = "/models/genrm-1.5b"


async def compute_score_genrm(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any],
    reward_router_address: str, reward_model_tokenizer: Any = None,
) -> dict[str, Any]:
    prompt = f"Problem:\n{extra_info['question']}\n\nSolution:\n{solution_str}\n\nScore 1-10."
    body = {"model": MODEL_PATH, "messages": [{"role": "user", "content": prompt}],
            "temperature": 0.7, "top_p": 0.8, "max_tokens": 64}
    url = f"http://{reward_router_address}/v1/chat/completions"
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        answer = json.loads(await resp.text())
    text = answer["choices"][0]["message"]["content"]
    return {"score": float(len(text) % 10), "genrm_response": text,
            "grm_fingerprint": answer["grm_fingerprint"]["fingerprint_id"],
            "seed": answer["grm_fingerprint"]["seed"]}


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """An unkeyed gateway on STUB replicas, as a router on the trainer's private network."""
    with gateway_on_stubs(tmp_path_factory.mktemp("genrm"), "--served-model-name", MODEL_PATH,
                          stub_args=("--served-model-name", MODEL_PATH)) as (gw, _):
        yield gw


def test_verl_genrm_function_through_reward_router_address(
    router: Proc, tiny_policy: Path, loop: asyncio.AbstractEventLoop
) -> None:
    prefix = "reward.custom_reward_function"
    address = router.url.removeprefix("http://")
    config = verl_config([
        f"actor_rollout_ref.model.path={tiny_policy}",
        f"{prefix}.path=pkg://tests.trainers.test_verl_genrm",
        f"{prefix}.name=compute_score_genrm",
        f"+{prefix}.reward_kwargs.reward_router_address={address}",
    ])
    data = batch(AutoTokenizer.from_pretrained(str(tiny_policy)))

    first = loop.run_until_complete(RewardLoopWorker(config).compute_score_batch(data))
    again = loop.run_until_complete(RewardLoopWorker(config).compute_score_batch(data))

    info = [o["reward_extra_info"] for o in first]
    assert all(i["genrm_response"].startswith("stub-") for i in info)
    assert len({i["grm_fingerprint"] for i in info}) == 1
    assert {i["seed"] for i in info} != {None}, "the gateway gave each request its seed"
    assert [o["reward_score"] for o in first] == [o["reward_score"] for o in again]
