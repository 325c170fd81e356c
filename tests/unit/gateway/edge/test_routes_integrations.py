"""OpenRLHF's remote reward protocol on `POST /openrlhf/reward`, app in process, STUB behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grm_service.config import Settings
from tests.support.gateway import client, received, serving
from tests.support.procs import Proc

SCORERS = ["rule=tests.support.scoring:rule_score", "broken=tests.support.scoring:broken_score"]
PROMPT = "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"


async def test_rewards_in_order_and_failed_items_flagged(stub: Proc, tmp_path: Path) -> None:
    settings = Settings(replica_urls=[stub.url], served_model_name="rm", work_dir=tmp_path,
                        scorers=SCORERS)
    body = {"query": [PROMPT + "4<|im_end|>", PROMPT + "5<|im_end|>"],
            "prompts": [PROMPT, PROMPT], "labels": ["4", "4"]}
    async with serving(settings) as (hot, _), client(hot.app) as api:
        rule = await api.post("/openrlhf/reward", params={"scorer": "rule"}, json=body)
        kept = await api.post("/openrlhf/reward",
                              params={"scorer": "rule", "special_tokens": "keep"}, json=body)
        broken = await api.post("/openrlhf/reward",
                                params={"scorer": "broken", "error_reward": -2}, json=body)
        uneven = await api.post("/openrlhf/reward", params={"scorer": "rule"},
                                json={**body, "prompts": [PROMPT]})
        no_scorer = await api.post("/openrlhf/reward", params={"scorer": ""}, json=body)
        await received(stub.url)
    assert rule.status_code == 200, rule.text
    assert rule.json()["rewards"] == [1.0, 0.0]
    assert rule.json()["extra_logs"] == {"grm_error": [0.0, 0.0]}
    assert kept.json()["rewards"] == [0.0, 0.0], "<|im_end|> kept: no completion equals 4"
    assert broken.status_code == 200
    assert broken.json()["rewards"] == [-2.0, -2.0]
    assert broken.json()["extra_logs"] == {"grm_error": [1.0, 1.0]}
    assert broken.json()["grm_errors"][0] == "scorer broken raised ZeroDivisionError: boom"
    assert uneven.status_code == 400 and "differ in length" in uneven.text
    assert no_scorer.status_code == 400


ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.parametrize("server", ["grm_service.gateway.app", "grm_service.workers.worker"])
def test_the_server_never_imports_the_client(server: str) -> None:
    """The route speaks OpenRLHF's protocol without the client SDK (or its httpx retries and
    defaults) loaded in a serving process: a fresh interpreter, as a worker starts."""
    code = (f"import sys, {server}; "
            "print(sorted(m for m in sys.modules if m.startswith('grm_service.client')))")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60,
                           check=True)
    assert shown.stdout.strip() == "[]", f"{server} loads {shown.stdout.strip()}"
