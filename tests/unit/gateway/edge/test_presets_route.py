"""Named scorer presets (GRM_SCORER_PRESETS) and the ocr text-policy refusal, on `POST /v1/score`
and `POST /openrlhf/reward` of the app in process, a STUB replica behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from grm_service.config import Settings
from grm_service.errors import ConfigError
from grm_service.scoring.presets import load
from tests.support.gateway import client, received, serving
from tests.support.procs import Proc
from tests.support.scoring import data_url

# The STUB answers "stub-<hex>": a judge pattern that reads its first digit as the score.
PRESETS = """
first-digit:
  scorer: judge
  options: {pattern: "stub-\\\\D*(\\\\d)", min: 0, max: 9}
  sampling: {max_tokens: 7}
"""


def settings(stub: Proc, tmp_path: Path, presets: str = PRESETS, **over: Any) -> Settings:
    path = tmp_path / "presets.yaml"
    path.write_text(presets)
    load.cache_clear()
    return Settings(replica_urls=[stub.url], served_model_name="rm", work_dir=tmp_path,
                    scorer_presets=path, **over)


ITEM = {"id": "a", "prompt": "2+2?", "completion": "4", "reference": "4"}


async def test_a_preset_is_selected_by_name_from_score_and_openrlhf(
    stub: Proc, tmp_path: Path
) -> None:
    body = {"query": ["Q4"], "prompts": ["Q"], "labels": ["4"]}
    async with serving(settings(stub, tmp_path)) as (hot, _), client(hot.app) as api:
        await received(stub.url)
        scored = await api.post("/v1/score", json={"scorer": "first-digit", "items": [ITEM]})
        sent = await received(stub.url)
        over = await api.post("/v1/score", json={"scorer": "first-digit", "items": [ITEM],
                                                 "sampling": {"max_tokens": 9}})
        sent_over = await received(stub.url)
        plain = await api.post("/v1/score", json={"scorer": "judge", "items": [ITEM]})
        openrlhf = await api.post("/openrlhf/reward", params={"scorer": "first-digit"}, json=body)
        schema = (await api.get("/openapi.json")).json()
    assert scored.status_code == 200, scored.text
    result = scored.json()["results"][0]
    assert result["status"] == "ok", result
    digit = next(c for c in result["response"] if c.isdigit())
    assert result["score"] == int(digit) / 9
    assert scored.json()["fingerprint"]["scorer"] == "first-digit"
    assert sent[0]["body"]["max_tokens"] == 7, "the preset's sampling"
    assert sent_over[0]["body"]["max_tokens"] == 9, "the request's sampling wins"
    assert over.status_code == 200
    # The built-in judge's pattern wants "Score: n": the stub's text has none.
    assert plain.json()["results"][0]["status"] == "error"
    assert openrlhf.status_code == 200 and openrlhf.json()["extra_logs"] == {"grm_error": [0.0]}
    enum = schema["components"]["schemas"]["ScoreRequest"]["properties"]["scorer"]["enum"]
    assert "first-digit" in enum and "judge" in enum


@pytest.mark.parametrize(("presets", "message"), [
    ("judge:\n  scorer: judge\n", "has the name of a scorer"),
    ("x:\n  scorer: nope\n", "uses scorer 'nope'"),
    ("x:\n  scorer: judge\n  options: {mni: 1}\n", "judge options: unknown mni"),
    ("x:\n  scorer: pairwise\n  options: {strategy: swiss}\n", "strategy must be one of"),
    ("x:\n  scorer: judge\n  temperature: 0\n", "temperature"),
    ("- a\n- b\n", "must be a mapping"),
])
async def test_a_bad_preset_fails_start_up(
    stub: Proc, tmp_path: Path, presets: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        async with serving(settings(stub, tmp_path, presets)):
            pass


GROUP_PRESET = """
pair-digit:
  scorer: pairwise
  options: {pattern: "stub-([0-9a-f])", strategy: all_pairs,
            verdicts: {"0": 1, "1": 1, "2": 1, "3": 1, "4": 1, "5": 1, "6": 1, "7": 0, "8": 0,
                       "9": 0, "a": 0, "b": 0, "c": 0.5, "d": 0.5, "e": 0.5, "f": 0.5}}
"""


async def test_a_group_scorer_preset_judges_the_group(stub: Proc, tmp_path: Path) -> None:
    items = [{"id": str(n), "prompt": "p", "completion": f"c{n}"} for n in range(3)]
    async with serving(settings(stub, tmp_path, GROUP_PRESET)) as (hot, _), \
            client(hot.app) as api:
        await received(stub.url)
        scored = await api.post("/v1/score", json={"scorer": "pair-digit", "items": items})
        sent = await received(stub.url)
    assert scored.status_code == 200, scored.text
    assert all(r["status"] == "ok" for r in scored.json()["results"]), scored.text
    assert len(sent) == 3  # all_pairs of 3


async def test_ocr_refuses_a_text_policy_unless_told(stub: Proc, tmp_path: Path) -> None:
    image_item = {**ITEM, "image": data_url("4")}
    async with serving(settings(stub, tmp_path)) as (hot, _), client(hot.app) as api:
        refused = await api.post("/v1/score", json={"scorer": "ocr", "items": [image_item]})
        told = await api.post("/v1/score", json={"scorer": "ocr", "items": [image_item],
                                                 "options": {"ignore_completion": True}})
        image_only = {k: v for k, v in image_item.items() if k not in ("completion", "prompt")}
        plain = await api.post("/v1/score", json={"scorer": "ocr", "items": [image_only]})
        openrlhf = await api.post("/openrlhf/reward", params={"scorer": "ocr"},
                                  json={"query": ["Q4"], "prompts": ["Q"], "labels": ["4"]})
        await received(stub.url)
    assert refused.status_code == 400
    assert "judge scorer" in refused.text and "ignore_completion" in refused.text
    assert told.status_code == 200 and told.json()["results"][0]["status"] == "ok"
    assert plain.status_code == 200 and plain.json()["results"][0]["status"] == "ok"
    assert openrlhf.status_code == 400 and "judge scorer" in openrlhf.text
