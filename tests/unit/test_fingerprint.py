from __future__ import annotations

import os
from pathlib import Path

import blake3
import pytest

from grm_service import fingerprint
from grm_service.commands.prober import output_of
from grm_service.config import Settings
from grm_service.engine_side.identity import ReplicaIdentity, compute_identity
from grm_service.engines import ReplicaSpec, VllmCpu, VllmGpu
from grm_service.fingerprint import digest, parts_digest
from grm_service.replicas import canary


def _model(tmp_path: Path) -> Path:
    root = tmp_path / "model"
    root.mkdir()
    (root / "config.json").write_text('{"a": 1}')
    (root / "model.safetensors").write_bytes(b"\x00weights" * 100)
    (root / "README.md").write_text("not part of the numbers")
    return root


def test_model_hash_covers_content_and_names(tmp_path: Path) -> None:
    root = _model(tmp_path)
    first = fingerprint.model_hash(str(root))
    assert first.startswith("blake3:")
    (root / "README.md").write_text("edited docs")
    assert fingerprint.model_hash(str(root)) == first
    (root / "config.json").write_text('{"a": 2}')
    second = fingerprint.model_hash(str(root))
    assert second != first
    (root / "config.json").rename(root / "config2.json")
    assert fingerprint.model_hash(str(root)) != second


def test_model_hash_cache_is_keyed_by_size_and_mtime(tmp_path: Path) -> None:
    root = _model(tmp_path)
    cache = tmp_path / "cache"
    first = fingerprint.model_hash(str(root), cache)
    weights = root / "model.safetensors"
    stat = weights.stat()
    weights.write_bytes(b"\x01weights" * 100)  # same size
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert fingerprint.model_hash(str(root), cache) == first, "cache hit expected"
    assert fingerprint.model_hash(str(root)) != first, "uncached hash sees the new bytes"
    weights.touch()
    assert fingerprint.model_hash(str(root), cache) != first


def test_hub_id_is_marked_as_name_only() -> None:
    assert fingerprint.model_hash("org/not-a-local-folder").startswith("name:")


def _identity(host: str = "127.0.0.1", index: int = 0, **overrides: object) -> ReplicaIdentity:
    """What a replica started from the GPU profile's recipe would report about itself."""
    settings = Settings(model="m", **overrides)  # type: ignore[arg-type]
    engine = VllmGpu(settings)
    spec = ReplicaSpec(name=f"r{index}", index=index, port=8000 + index,
                       work_dir=settings.work_dir / f"r{index}", gpus=(index,))
    command = engine.command(spec, {"PATH": "/bin", "HOSTNAME": f"node{index}"}, host)
    return compute_identity(command.argv, command.env)


def _digest(**overrides: object) -> str:
    digest = _identity(**overrides).env_digest
    assert digest is not None
    return digest


def test_env_digest_ignores_placement() -> None:
    base = _digest()
    assert _digest(replicas=4, port=9999, host="0.0.0.0") == base
    assert _digest(work_dir=Path("/elsewhere")) == base
    assert _digest(index=1, host="10.0.0.2") == base  # other GPU, port, host and node name


def test_env_digest_leaves_secrets_and_unknown_variables_out() -> None:
    base = _identity()
    other = _identity(engine_env={"HF_TOKEN": "hf_secret", "SOME_CACHE": "/x"})
    assert other.env_digest == base.env_digest
    assert "hf_secret" not in other.model_dump_json()


@pytest.mark.parametrize(
    "var",
    ["VLLM_BATCH_INVARIANT", "CUBLAS_WORKSPACE_CONFIG", "FLASH_ATTENTION_DETERMINISTIC",
     "NCCL_DETERMINISTIC", "NCCL_ALGO", "NCCL_PROTO", "PYTHONHASHSEED"],
)
def test_env_digest_changes_with_each_deterministic_var(var: str) -> None:
    assert _digest(engine_env={var: "changed"}) != _digest()


@pytest.mark.parametrize(
    "overrides",
    [{"dtype": "bfloat16"}, {"max_model_len": 1024},
     {"engine_args": ["--tensor-parallel-size", "2"]}, {"engine_args": ["--quantization=fp8"]},
     {"engine_args": ["--enforce-eager"]}, {"seed": 7}],
)
def test_env_digest_changes_with_numerics(overrides: dict[str, object]) -> None:
    assert _digest(**overrides) != _digest()


def test_cpu_profile_never_sets_batch_invariance() -> None:
    assert "VLLM_BATCH_INVARIANT" not in VllmCpu(Settings(model="m")).deterministic_env()
    assert VllmCpu(Settings(model="m")).capabilities().batch_invariant is False


def test_fingerprint_id_depends_on_each_part() -> None:
    base = fingerprint.fingerprint_id(1, "m", "e")
    assert base.startswith("grm-")
    assert len({base, fingerprint.fingerprint_id(2, "m", "e"),
                fingerprint.fingerprint_id(1, "m2", "e"),
                fingerprint.fingerprint_id(1, "m", "e2")}) == 4


def test_response_digest_covers_content_and_logprobs_only() -> None:
    choice = {"index": 0, "message": {"content": "hi"}, "logprobs": {"content": [1.0]}}
    payload = {"id": "a", "created": 1, "choices": [choice]}
    same = {"id": "b", "created": 2, "choices": [choice]}
    other = {"choices": [{**choice, "logprobs": {"content": [1.5]}}]}
    assert fingerprint.response_digest(payload) == fingerprint.response_digest(same)
    assert fingerprint.response_digest(payload) != fingerprint.response_digest(other)


def test_response_digest_of_a_pooling_answer_covers_its_data() -> None:
    a = {"id": "x", "data": [{"index": 0, "probs": [0.25]}]}
    b = {"id": "y", "data": [{"index": 0, "probs": [0.25]}]}
    c = {"id": "x", "data": [{"index": 0, "probs": [0.5]}]}
    assert fingerprint.response_digest(a) == fingerprint.response_digest(b)
    assert fingerprint.response_digest(a) != fingerprint.response_digest(c)


# Answers and their response digests as served before the canaries and `verify` shared this
# function: the served digest must never move.
CHAT_ANSWER = {"id": "chatcmpl-1", "created": 5, "choices": [
    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Score: 7"},
     "logprobs": {"content": [{"token": "Score", "logprob": -0.25, "bytes": [83],
                               "top_logprobs": []}]}},
    {"index": 1, "message": {"role": "assistant", "content": "caf\u00e9 1e-05"},
     "logprobs": None}]}
COMPLETION_ANSWER = {"choices": [{"index": 0, "text": "plain text", "logprobs": None}]}
POOLING_ANSWER = {"data": [{"index": 0, "probs": [0.25, 0.75]}]}


@pytest.mark.parametrize(("payload", "served"), [
    (CHAT_ANSWER, "251a903faba74f7fb90e4adbe1823f67"),
    (COMPLETION_ANSWER, "ec60810777d508e3e5b94f3fd92ff9b1"),
    (POOLING_ANSWER, "9f360e6d89ed4c3080a96180569fbbd5"),
])
def test_response_digest_is_what_was_served(payload: dict[str, object], served: str) -> None:
    assert fingerprint.response_digest(payload) == served


def test_the_canary_and_verify_compare_the_served_digest() -> None:
    swapped = {"choices": [{**c, "index": 1 - c["index"]} for c in CHAT_ANSWER["choices"]]}
    for payload in (CHAT_ANSWER, swapped):
        served = fingerprint.response_digest(payload)
        assert output_of(payload)["digest"] == served
        assert canary._digest(payload) == served
    # Choices in another order are another answer to all three (they were alike to two).
    assert fingerprint.response_digest(swapped) != fingerprint.response_digest(CHAT_ANSWER)


@pytest.mark.parametrize("data", [b"", b"a", bytes(range(256)) * 40])
def test_digests_are_blake3_hex_prefixes_of_every_length(data: bytes) -> None:
    whole = blake3.blake3(data).hexdigest()
    for length in range(1, 65):
        assert digest(data, length) == whole[:length]
        assert parts_digest([data[:7], memoryview(data)[7:]], length) == whole[:length]
    assert digest(data) == whole[:32] == parts_digest([data])
