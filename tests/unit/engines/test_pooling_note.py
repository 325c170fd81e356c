"""Each engine profile says what was measured of co-batched pooling (`/v1/capabilities`)."""

from __future__ import annotations

from grm_service.config import Settings
from grm_service.engines import engine_named


def test_capabilities_say_what_was_measured_of_pooling() -> None:
    settings = Settings(model="m")  # type: ignore[call-arg]
    cpu = engine_named("vllm-cpu", settings).capabilities("0.32.0", {})
    assert not cpu.pooling_invariant and "serialized per replica" in cpu.pooling_note
    assert "reward head" in cpu.pooling_note and "CLIP" in cpu.pooling_note
    assert "bitwise" in cpu.pooling_note and "not claimed" in cpu.pooling_note
    gpu = engine_named("vllm", settings).capabilities("0.25.0", {"VLLM_BATCH_INVARIANT": "1"})
    assert gpu.pooling_invariant and "pooling canary proved it" in gpu.pooling_note
    other = engine_named("vllm", settings).capabilities("0.26.0", {"VLLM_BATCH_INVARIANT": "1"})
    assert not other.pooling_invariant and "runs alone on its replica" in other.pooling_note
