"""Whether a request runs alone on its replica: the engine's batch-invariance, as its profile
declares it and the replica's canaries proved it, against what the body samples."""

from __future__ import annotations

from typing import Any

from grm_service.config import SerializeMode
from grm_service.engines import Capabilities
from grm_service.replicas.pool import Replica

# Enum members compared with per request, read once: an attribute read on an Enum class goes
# through its metaclass's `__getattr__` hook in Python 3.11 (~0.7 k instructions).
_ON, _AUTO = SerializeMode.ON, SerializeMode.AUTO


def _truncates_sampling(body: dict[str, Any]) -> bool:
    if body.get("temperature") == 0:
        return False  # greedy: no nucleus edge to disagree on
    # A missing top_p may still be set below 1 by the model's generation config.
    top_p = body.get("top_p")
    top_k = body.get("top_k")
    return top_p is None or top_p < 1 or (top_k is not None and top_k > 0)


def pooling_alone(replica: Replica, caps: Capabilities, mode: SerializeMode) -> bool:
    """Pooling runs alone on a replica unless the engine profile declares it batch-invariant
    (an engine version where that was measured) and the replica's pooling canary proved it."""
    if mode is _ON:
        return True
    return not (caps.pooling_invariant and replica.pooling_batched)


def runs_alone(replica: Replica, pooling: bool, alone: bool, caps: Capabilities,
               mode: SerializeMode) -> bool:
    """Whether this request runs alone on `replica`: `alone` (`must_run_alone` of a generative
    body), a replica the live audit serialized, or pooling not proven there."""
    return alone or replica.serialized or (pooling and pooling_alone(replica, caps, mode))


def must_run_alone(body: dict[str, Any], caps: Capabilities, mode: SerializeMode) -> bool:
    if mode is not _AUTO:
        return mode is _ON
    if not caps.batch_invariant:
        return True
    return not caps.sampling_invariant and _truncates_sampling(body)
