"""Every trainer path against a keyed gateway on STUB replicas (the thing under test is the
integration): 401 without the key, answers with it; failures the trainer or user can see
(`grm-service score` exit code, `grm_score_items_total`, OpenAI-shaped validation errors)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from grm_service.client import GrmClient, RequestRejected
from grm_service.integrations import trl, verl
from tests.support.procs import Proc, gateway_on_stubs
from tests.support.scoring import png

KEY = "trainer-key"
SCORERS = "trainer=tests.support.scoring:trainer_score"
PROMPTS = ["What is 2+2?", "FAIL this one", "Say hi."]
ANSWERS = ["4", "x", "hello"]
LABELS = ["4", "x", "hi"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, stub_pair: list[Proc]) -> Iterator[Proc]:
    env = {"GRM_API_KEYS": KEY, "GRM_SCORERS": SCORERS}
    with gateway_on_stubs(tmp_path_factory.mktemp("keyed"), env=env,
                          shared=stub_pair) as (gw, _):
        yield gw


def test_client_needs_the_key(gateway: Proc) -> None:
    with GrmClient(gateway.url) as anonymous, pytest.raises(RequestRejected) as refused:
        anonymous.score([{"id": "a", "completion": "4", "reference": "4"}], "trainer")
    assert refused.value.status == 401
    with GrmClient(gateway.url, api_key=KEY) as keyed:
        assert keyed.score([{"id": "a", "completion": "4", "reference": "4"}],
                           "trainer")[0].score == 1.0


async def test_trl_functions_need_the_key(gateway: Proc) -> None:
    columns = {"reference": LABELS, "completion_ids": [[1], [2], [3]]}
    for make in (trl.grm_reward, trl.async_grm_reward):
        anonymous = make(gateway.url, "trainer")
        keyed = make(gateway.url, "trainer", api_key=KEY, headers={"x-run": "test"})
        with pytest.raises(RequestRejected, match="HTTP 401"):
            await _call(anonymous, columns)
        rewards = await _call(keyed, columns)
        assert rewards[0] == 1.0 and rewards[1] is None and isinstance(rewards[2], float)


async def _call(function: object, columns: dict[str, object]) -> list[float | None]:
    answer = function(prompts=PROMPTS, completions=ANSWERS, **columns)  # type: ignore[operator]
    return await answer if hasattr(answer, "__await__") else answer  # type: ignore[no-any-return]


async def test_verl_functions_need_the_key(gateway: Proc, monkeypatch: pytest.MonkeyPatch) -> None:
    # verl logs reward_kwargs, so its functions take the key from the workers' environment only.
    monkeypatch.setenv("GRM_TEST_TRAINER_KEY", KEY)
    kw = {"url": gateway.url, "scorer": "trainer", "error_score": -1.0}
    keyed = {**kw, "api_key_env": "GRM_TEST_TRAINER_KEY"}
    with pytest.raises(RequestRejected, match="HTTP 401"):
        await verl.compute_score("s", "4", "4", {"question": "2+2?"}, **kw)
    with pytest.raises(RequestRejected, match="HTTP 401"):
        verl.compute_score_batch(["s"], ["4"], ["4"], [None], **kw)
    one = await verl.compute_score("s", "4", ["four", "4"], {"question": "2+2?"}, **keyed)
    batch = verl.compute_score_batch(["s"] * 3, ANSWERS, LABELS,
                                     [{"question": p} for p in PROMPTS], **keyed)
    fingerprint = httpx.get(gateway.url + "/v1/fingerprint",
                            headers={"authorization": f"Bearer {KEY}"}).json()
    await verl.close_clients()  # both forms': their sockets, not left to the collector
    assert one["score"] == 1.0 and one["grm_error"] == 0.0
    assert one["grm_fingerprint"] == fingerprint["fingerprint_id"]
    assert [b["score"] for b in batch][:2] == [1.0, -1.0]
    assert [b["grm_error"] for b in batch] == [0.0, 1.0, 0.0]


def test_verl_reads_the_key_from_the_environment(gateway: Proc) -> None:
    # GRM_API_KEY, set for a child process (library code never touches os.environ).
    code = ("from grm_service.integrations import verl; "
            f"print(verl.compute_score_batch(['s'], ['4'], ['4'], [None], url={gateway.url!r},"
            " scorer='trainer')[0]['score'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "GRM_API_KEY": KEY}, timeout=120, check=False)
    assert done.stdout.strip() == "1.0", done.stderr


def test_openrlhf_key_in_the_url(gateway: Proc) -> None:
    body = {"query": [p + a for p, a in zip(PROMPTS, ANSWERS, strict=True)],
            "prompts": PROMPTS, "labels": LABELS}
    path = "/openrlhf/reward?scorer=trainer&error_reward=-1"
    assert httpx.post(gateway.url + path, json=body).status_code == 401
    keyed = gateway.url.replace("http://", f"http://grm:{KEY}@")
    answer = httpx.post(keyed + path, json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["rewards"][:2] == [1.0, -1.0]
    assert answer.json()["extra_logs"] == {"grm_error": [0.0, 1.0, 0.0]}


def manifest(tmp_path: Path, *, broken: bool) -> Path:
    (tmp_path / "a.png").write_bytes(png("4"))
    rows = [{"id": "a", "image": "a.png", "reference": "4"}]
    if broken:
        rows.append({"id": "b", "image": "missing.png", "reference": "4"})
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def score_cli(gateway: Proc, items: Path, out: Path, *extra: str,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "grm_service.cli", "score", str(items), "--url", gateway.url,
            "-o", str(out), "--scorer", "trainer", *extra]
    base = {k: v for k, v in os.environ.items() if k != "GRM_API_KEY"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False,
                          env={**base, **(env or {})})


def test_score_cli_key_by_flag_or_environment(gateway: Proc, tmp_path: Path) -> None:
    items = manifest(tmp_path, broken=False)
    refused = score_cli(gateway, items, tmp_path / "none.jsonl")
    assert refused.returncode == 1 and "HTTP 401" in refused.stderr
    by_flag = score_cli(gateway, items, tmp_path / "flag.jsonl", "--api-key", KEY)
    by_env = score_cli(gateway, items, tmp_path / "env.jsonl", env={"GRM_API_KEY": KEY})
    assert (by_flag.returncode, by_env.returncode) == (0, 0), by_flag.stderr + by_env.stderr
    assert json.loads((tmp_path / "env.jsonl").read_text())["status"] == "ok"


def test_score_cli_fails_when_an_item_failed(gateway: Proc, tmp_path: Path) -> None:
    items = manifest(tmp_path, broken=True)
    strict = score_cli(gateway, items, tmp_path / "strict.jsonl", "--api-key", KEY)
    assert strict.returncode == 1
    assert "1 of 2 items failed" in strict.stderr
    lenient = score_cli(gateway, items, tmp_path / "lenient.jsonl", "--api-key", KEY,
                        "--allow-errors")
    assert lenient.returncode == 0, lenient.stderr
    assert "1 errors" in lenient.stderr


def test_failed_items_are_counted(gateway: Proc) -> None:
    def count(status: str) -> float:
        text = httpx.get(gateway.url + "/metrics",
                         headers={"authorization": f"Bearer {KEY}"}).text
        line = f'grm_score_items_total{{scorer="trainer",status="{status}"}} '
        found = [row for row in text.splitlines() if row.startswith(line)]
        return float(found[0].split()[-1]) if found else 0.0

    before = count("ok"), count("error")
    items = [{"id": str(i), "prompt": p, "completion": a, "reference": r}
             for i, (p, a, r) in enumerate(zip(PROMPTS, ANSWERS, LABELS, strict=True))]
    with GrmClient(gateway.url, api_key=KEY) as client:
        results = client.score(items, "trainer")
    assert [r.status for r in results] == ["ok", "error", "ok"]  # and the batch was a 200
    assert (count("ok"), count("error")) == (before[0] + 2, before[1] + 1)


def test_openai_sdk_reads_the_validation_error(gateway: Proc) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.post("/score", body={"scorer": "trainer", "items": [{"prompt": "no id"}]},
                    cast_to=object)
    assert "items.0.id: Field required" in caught.value.message
    assert caught.value.param == "items.0.id"  # type: ignore[attr-defined]
    assert (caught.value.type, caught.value.code) == ("invalid_request_error", "invalid_fields")
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="another-model",
                                       messages=[{"role": "user", "content": "hi"}])
    assert (unknown.value.type, unknown.value.code) == ("not_found_error", "unknown_model")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gateway.url + "/v1", api_key="wrong", max_retries=0).post(
            "/score", body={}, cast_to=object)


def test_openrlhf_refuses_a_non_finite_error_reward(gateway: Proc) -> None:
    body = {"query": ["FAIL x"], "prompts": ["FAIL "], "labels": ["4"]}
    url = gateway.url + "/openrlhf/reward?scorer=trainer&error_reward=nan"
    refused = httpx.post(url, json=body, headers={"authorization": f"Bearer {KEY}"})
    assert refused.status_code == 422
    assert refused.json()["error"]["param"] == "query.error_reward"
