"""The service as NeMo Gym's resources server and model server, called by nemo-gym's own models
and HTTP client (tests/gym/rollouts.py), on STUB replicas."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from nemo_gym.base_resources_server import BaseVerifyRequest, BaseVerifyResponse
from nemo_gym.config_types import AggregateMetrics
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.reward_profile import compute_aggregate_metrics
from nemo_gym.server_utils import get_response_json

from tests.gym.rollouts import MODEL, RESOURCES, collect, server_client
from tests.support.procs import Proc, received

# Rows of a Gym dataset (its example.jsonl's shape), with the indices rollout collection adds:
# task 0 twice (two repeats), task 1 once.
ROWS = [
    {"responses_create_params": {"input": [{"role": "user", "content": question}]},
     "expected_answer": expected, "_ng_task_index": task, "_ng_rollout_index": repeat}
    for question, expected, task, repeat in (
        ("Who proposed natural selection?", "darwin", 0, 0),
        ("Who proposed natural selection?", "darwin", 0, 1),
        ("What is an area of wet land called?", "wetland", 1, 0),
    )
]


def run(loop: asyncio.AbstractEventLoop, url: str,
        rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # A bound on Gym's client, which retries a failed connection without end.
    async def bounded() -> list[dict[str, Any]]:
        async with asyncio.timeout(120):
            return await collect(url, "rm", rows)

    return loop.run_until_complete(bounded())


def judged(answers: list[dict[str, Any]]) -> str:
    """What a run decided, as JSON: each reward, its judgment's fingerprint and digest, and the
    policy's answer as produced (a response's ids and time are drawn anew each time)."""
    return json.dumps([[a["reward"], a["grm_digest"], a["grm_fingerprint"],
                        a["response"]["grm_fingerprint"]["response_digest"]] for a in answers])


def test_gyms_rollouts_get_rewards_and_fingerprints_from_verify(
    served: tuple[Proc, list[Proc]], loop: asyncio.AbstractEventLoop
) -> None:
    gateway, stubs = served
    received(stubs, clear=True)
    first = run(loop, gateway.url, ROWS)
    sent = received(stubs)
    received(stubs, clear=True)
    second = run(loop, gateway.url, list(reversed(ROWS)))[::-1]
    assert judged(first) == judged(second), "a second run gives the same rewards, bit for bit"
    for row, answer in zip(ROWS, first, strict=True):
        # Gym's BaseVerifyResponse: the request as sent, the reward, and (kept by the agent's
        # model, extra="allow") the service's fingerprint of the judgment.
        BaseVerifyResponse.model_validate(answer)
        assert answer["expected_answer"] == row["expected_answer"]
        assert answer["_ng_rollout_index"] == row["_ng_rollout_index"]
        text = answer["response"]["output"][0]["content"][0]["text"]
        assert answer["reward"] == (len(text) % 7) / 10  # tests/support/scoring.trainer_score
        assert answer["grm_fingerprint"]["seed"] == 42
        assert answer["response"]["grm_fingerprint"]["seed"] == 42  # the policy's answer too
    # Each rollout reached a replica twice: the policy's answer, then the judgment.
    assert sorted(s["path"] for s in sent) == ["/v1/chat/completions"] * 3 + ["/v1/responses"] * 3


def test_a_judge_of_gym_calls_its_model_server_over_responses(
    gateway: Proc, loop: asyncio.AbstractEventLoop
) -> None:
    """Gym's LLM judges (`equivalence_llm_judge`) post their params to their judge model server's
    `/v1/responses` and read a `NeMoGymResponse`: the service is that server."""
    params = NeMoGymResponseCreateParamsNonStreaming(
        input=[{"role": "user", "content": "Are darwin and Darwin the same? [[A=B]] or [[A!=B]]"}],
        max_output_tokens=16, temperature=0.0)

    async def judge() -> tuple[NeMoGymResponse, dict[str, str]]:
        server = server_client(gateway.url)
        async with asyncio.timeout(60):
            answer = await server.post(server_name=MODEL, url_path="/v1/responses", json=params)
            return (NeMoGymResponse.model_validate(await get_response_json(answer)),
                    dict(answer.headers))

    judged, headers = loop.run_until_complete(judge())
    assert judged.output[0].content[0].text.startswith("stub-")
    assert headers["x-grm-seed"] == "42" and headers["x-grm-fingerprint"].startswith("grm-")


@pytest.mark.parametrize(("change", "status", "says"), [
    ({"response": {"output": "4"}}, 400, "response.output must be a list"),
    ({"expected_answer": ["darwin"]}, 400, "expected_answer (the reference"),
    ({"group_id": "g"}, 400, "a group needs both group_id and group_size"),
])
def test_bad_verify_requests_are_refused_naming_the_field(
    gateway: Proc, loop: asyncio.AbstractEventLoop, change: dict[str, Any], status: int,
    says: str
) -> None:
    """Built with Gym's own request model, then spoiled where Gym's model lets it be."""
    asked = BaseVerifyRequest.model_validate({
        **ROWS[0], "response": NeMoGymResponse.model_validate({
            "id": "resp_1", "created_at": 0, "model": "rm", "object": "response", "output": [],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}).model_dump()})

    async def verify() -> tuple[int, str]:
        server = server_client(gateway.url)
        async with asyncio.timeout(60):
            answer = await server.post(server_name=RESOURCES, url_path="/verify",
                                       json={**asked.model_dump(), **ROWS[0], **change})
            return answer.status, (await answer.read()).decode()

    got, text = loop.run_until_complete(verify())
    assert got == status and says in text, text


def test_aggregate_metrics_answers_gyms_model_with_gyms_own_means(
    served: tuple[Proc, list[Proc]], loop: asyncio.AbstractEventLoop
) -> None:
    """What rollout collection calls last: the service's answer is Gym's `AggregateMetrics`,
    with the means Gym's own resources servers compute from the same verify responses."""
    gateway, _ = served
    answers = run(loop, gateway.url, ROWS)

    async def aggregate() -> tuple[int, dict[str, Any]]:
        server = server_client(gateway.url)
        async with asyncio.timeout(60):
            got = await server.post(server_name=RESOURCES, url_path="/aggregate_metrics",
                                    json={"verify_responses": answers})
            return got.status, await get_response_json(got)

    status, metrics = loop.run_until_complete(aggregate())
    assert status == 200, metrics
    ours = AggregateMetrics.model_validate(metrics)
    gyms = compute_aggregate_metrics(answers)
    assert ours.key_metrics["mean/reward"] == pytest.approx(gyms.key_metrics["mean/reward"])
    assert [g["_ng_task_index"] for g in ours.group_level_metrics] == [0, 1]
    assert [g["mean/reward"] for g in ours.group_level_metrics] == pytest.approx(
        [g["mean/reward"] for g in gyms.group_level_metrics])
