from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from grm_service.commands.diffing import NONDETERMINISM, UNPROVEN, diff_runs, explain, load_results

FP = {"fingerprint_id": "grm-1", "identity": "verified", "device": "H200", "seed": 42,
      "tensor_parallel_size": 1,
      "model_hash": "blake3:aa", "engine": "vllm",
      "engine_version": "0.25.0", "env_digest": "e1", "replica": "r0", "serialized": False,
      "request_digest": "q1", "response_digest": "p1"}


def item(score: float = 0.5, response: str = "abc", **fp: Any) -> dict[str, Any]:
    return {"id": "x", "score": score, "status": "ok", "error": None, "response": response,
            "fingerprint": {**FP, **fp}}


@pytest.mark.parametrize(
    ("b", "cause"),
    [
        (item(0.7, "abd", seed=43, env_digest="e2"), "seed differs"),
        (item(0.7, model_hash="blake3:bb", env_digest="e2"), "model hash differs"),
        (item(0.7, engine_version="0.26.0", env_digest="e2"), "engine version differs"),
        (item(0.7, env_digest="e2"), "env digest differs"),
        (item(0.7, request_digest="q2"), "request differs"),
        (item(0.7, response_digest="p2", replica="r1"), NONDETERMINISM),
        (item(0.7, identity="unverified", model_hash=None), "one side's replicas proved"),
        (item(0.7, device="A100", env_digest="e2"), "device differs"),
        (item(0.7, tensor_parallel_size=2, env_digest="e2"), "tensor-parallel size differs"),
    ],
)
def test_explain_names_the_first_differing_component(b: dict[str, Any], cause: str) -> None:
    found = explain(item(), b)
    assert found is not None and found.cause.startswith(cause), found


def test_same_output_is_no_difference_even_on_another_replica() -> None:
    assert explain(item(), item(replica="r1")) is None


def test_env_digest_cause_names_the_input_given_identities() -> None:
    ident_a = {"env_inputs": {"env": {"VLLM_BATCH_INVARIANT": "1"},
                              "numerics": {"dtype": "bfloat16"}}}
    ident_b = {"env_inputs": {"env": {}, "numerics": {"dtype": "float32"}}}
    found = explain(item(), item(0.1, env_digest="e2"), (ident_a, ident_b))
    assert found is not None
    assert "env.VLLM_BATCH_INVARIANT: '1' vs None" in found.cause
    assert "numerics.dtype: 'bfloat16' vs 'float32'" in found.cause


def test_runs_report_missing_items_and_load_from_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(json.dumps({**item(), "id": i}) for i in ("1", "2")) + "\n")
    b.write_text(json.dumps({**item(0.9, response_digest="p9"), "id": "2"}) + "\n\n")
    diffs = diff_runs(load_results(a), load_results(b))
    assert [(d.id, d.cause) for d in diffs] == [("1", "only in A"), ("2", NONDETERMINISM)]


def test_bad_result_file_says_where(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        load_results(bad)


def test_same_unverified_fingerprint_is_not_called_nondeterminism() -> None:
    a = item(identity="unverified", model_hash=None, env_digest=None)
    b = item(0.7, "abd", identity="unverified", model_hash=None, env_digest=None)
    found = explain(a, b)
    assert found is not None and found.cause == UNPROVEN


def test_a_result_file_without_the_tensor_parallel_size_falls_back_to_the_env_digest() -> None:
    old = item()
    del old["fingerprint"]["tensor_parallel_size"]
    found = explain(old, item(0.7, tensor_parallel_size=2, env_digest="e2"))
    assert found is not None and found.cause.startswith("env digest differs"), found
    ident_a = {"env_inputs": {"numerics": {"tensor_parallel_size": 1}}}
    ident_b = {"env_inputs": {"numerics": {"tensor_parallel_size": 2}}}
    found = explain(old, item(0.7, env_digest="e2"), (ident_a, ident_b))
    assert found is not None and "numerics.tensor_parallel_size: 1 vs 2" in found.cause
