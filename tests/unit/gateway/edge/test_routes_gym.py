"""NeMo Gym's resources-server routes (`/verify`, `/seed_session`) and the Responses API
passthrough (`/v1/responses`), app in process, a STUB replica behind them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from grm_service.config import Settings
from grm_service.errors import ConfigError
from grm_service.gateway.edge.routes_gym import check_scorer
from tests.support.gateway import client, received, serving
from tests.support.procs import Proc

SCORERS = ["trainer=tests.support.scoring:trainer_score",
           "broken=tests.support.scoring:broken_score"]


def settings(stub: Proc, tmp_path: Path, **over: Any) -> Settings:
    return Settings(**{"replica_urls": [stub.url], "served_model_name": "rm", "seed": 11,
                       "max_tokens_default": 77, "work_dir": tmp_path, "scorers": SCORERS,
                       "verify_scorer": "trainer", **over})


def verify_body(completion: str = "4", **over: Any) -> dict[str, Any]:
    """A Gym verify request as its simple agent sends it (the dataset row's fields kept)."""
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "2+2?"}]},
        "response": {"id": "resp_1", "object": "response", "output": [
            {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": completion, "annotations": []}]}]},
        "expected_answer": "4", "question": "2+2?", "_ng_task_index": 0,
        "_ng_rollout_index": 0, **over,
    }


async def test_verify_answers_the_request_with_its_reward_and_fingerprint(
    stub: Proc, tmp_path: Path
) -> None:
    async with serving(settings(stub, tmp_path)) as (hot, _), client(hot.app) as api:
        await received(stub.url)  # the canary's probes
        right = await api.post("/verify", json=verify_body("4"))
        wrong = await api.post("/verify", json=verify_body("five", _ng_rollout_index=1))
        seeded = await api.post("/seed_session", json={"responses_create_params": {}})
        sent = await received(stub.url)
    assert right.status_code == 200, right.text
    answer = right.json()
    fp = answer.pop("grm_fingerprint")
    digest = answer.pop("grm_digest")
    assert answer == {**verify_body("4"), "reward": 1.0}  # Gym's BaseVerifyResponse
    assert fp["fingerprint_id"] == right.headers["x-grm-fingerprint"]
    assert fp["seed"] == 11 and fp["replica"] == right.headers["x-grm-replica"] == "r0"
    assert len(digest) == 32
    assert wrong.json()["reward"] == 0.4  # trainer_score: len("five") % 7 / 10
    assert [s["path"] for s in sent] == ["/v1/chat/completions"] * 2  # one judgment each
    assert seeded.status_code == 200 and seeded.json() == {}


async def test_a_verify_the_scorer_cannot_score_is_an_error_never_a_reward(
    stub: Proc, tmp_path: Path
) -> None:
    async with serving(settings(stub, tmp_path, verify_scorer="broken")) as (hot, _), \
            client(hot.app) as api:
        r = await api.post("/verify", json=verify_body())
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "no_reward"
    assert r.json()["error"]["message"] == (
        "no reward for this rollout: scorer broken raised ZeroDivisionError: boom")


async def test_bad_verify_requests_are_4xx_naming_what_to_fix(stub: Proc, tmp_path: Path) -> None:
    async with serving(settings(stub, tmp_path)) as (hot, _), client(hot.app) as api:
        await received(stub.url)
        missing = await api.post("/verify", json={"responses_create_params": {"input": "x"}})
        output = await api.post("/verify", json=verify_body() | {"response": {"output": 4}})
        group = await api.post("/verify", json=verify_body(group_id="g"))
        assert await received(stub.url) == [], "nothing refused reaches the replica"
    assert missing.status_code == 422 and missing.json()["error"]["param"] == "response"
    assert output.status_code == 400
    assert "response.output must be a list" in output.json()["error"]["message"]
    assert group.status_code == 400 and "group_size" in group.json()["error"]["message"]


def test_a_verify_scorer_that_is_none_fails_start_up(stub: Proc, tmp_path: Path) -> None:
    names = ["judge", "ocr"]
    assert check_scorer(settings(stub, tmp_path, verify_scorer="judge"), names) == names
    with pytest.raises(ConfigError, match="GRM_VERIFY_SCORER='nope' names no scorer or preset"):
        check_scorer(settings(stub, tmp_path, verify_scorer="nope"), names)


RESPONSES = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}


async def test_responses_are_seeded_bounded_and_fingerprinted_like_chat(
    stub: Proc, tmp_path: Path
) -> None:
    async with serving(settings(stub, tmp_path)) as (hot, _), client(hot.app) as api:
        await received(stub.url)
        first = await api.post("/v1/responses", json=RESPONSES)
        again = await api.post("/v1/responses", json=RESPONSES)
        own = await api.post("/v1/responses", json={**RESPONSES, "seed": 5,
                                                    "max_output_tokens": 9})
        sent = await received(stub.url)
    assert first.status_code == 200, first.text
    assert sent[0] == {"path": "/v1/responses", "body": {**RESPONSES, "seed": 11,
                                                         "max_output_tokens": 77, "model": "rm"}}
    assert sent[2]["body"]["seed"] == 5 and sent[2]["body"]["max_output_tokens"] == 9
    one, two = first.json(), again.json()
    assert one["output"][0]["id"] != two["output"][0]["id"]  # drawn anew by the engine
    # ... and left out of what the fingerprint says was produced.
    assert one["grm_fingerprint"]["response_digest"] == two["grm_fingerprint"]["response_digest"]
    assert one["grm_fingerprint"]["request_digest"] == two["grm_fingerprint"]["request_digest"]
    assert first.headers["x-grm-fingerprint"] == one["grm_fingerprint"]["fingerprint_id"]
    assert own.json()["grm_fingerprint"]["seed"] == 5
    # Another body, another text (the STUB's is drawn from the body): another output digest.
    assert own.json()["grm_fingerprint"]["response_digest"] != (
        one["grm_fingerprint"]["response_digest"])


@pytest.mark.parametrize(("extra", "status", "says"), [
    ({"previous_response_id": "resp_1"}, 400, "a stored response lives on one replica"),
    ({"background": True}, 400, "background"),
    ({"stream": True}, 400, "stream=false"),
    ({"max_output_tokens": 10**6}, 400, "max_output_tokens=1000000 is above"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, 400,
     "input[0].content[0]: part type 'input_file' is not accepted"),
    ({"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://example.com/cat.png"}]}]}, 400,
     "example.com"),
    ({"input": 7}, 422, "input"),
])
async def test_responses_refusals(stub: Proc, tmp_path: Path, extra: dict[str, Any],
                                  status: int, says: str) -> None:
    async with serving(settings(stub, tmp_path)) as (hot, _), client(hot.app) as api:
        await received(stub.url)
        r = await api.post("/v1/responses", json={**RESPONSES, **extra})
        assert await received(stub.url) == [], "nothing refused reaches the replica"
    assert r.status_code == status, r.text
    assert says in r.text
