"""How long a CPU replica's vLLM worker busy-polls for its next step before it sleeps.

vLLM's engine core sends each step to its worker process through a shared-memory queue. The
worker reads it in a loop that calls `sched_yield` for `busy_loop_s` (1 s, not configurable)
after every message before it sleeps on a socket: right for a GPU host with cores to spare,
but on CPU replicas every request costs the worker about a second of a core after its last
step. That second is taken from the replicas and the gateway beside it (`benchmarks/engine_poll.py
--busy-loops 1 0.05`, the tiny text model, one request every 2 s: 1.11 s of the replica's CPU per
request with vLLM's 1 s, 0.19 s with 0.05 s, the same latency).

The worker's steps within a request come milliseconds apart, so a short busy loop still covers
them; a request that comes after the loop has ended wakes the worker through the socket, as
every request does after a second idle with vLLM's default. Only the worker's wait for its next
step changes; the engine core's wait for a step's result is left as vLLM has it.

The engine profile sets `WORKER_BUSY_LOOP_ENV` in the replica's environment (the vllm-cpu
profile only); unset, nothing changes. Applied from the plugin's `register`, which vLLM calls in
the worker before it creates the worker's queues. It leans on vLLM's internals
(`WorkerProc._init_message_queues`, `rpc_broadcast_mq`, `_spin_condition.busy_loop_s`): a
release not in `KNOWN_VERSIONS`, or one whose layout differs, keeps vLLM's busy loop and says so.
Timing only: no number an engine computes depends on it.

Standard library only at module level (vLLM loads the plugin in every process it starts).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

WORKER_BUSY_LOOP_ENV = "GRM_VLLM_WORKER_BUSY_LOOP_S"
EXECUTOR_MODULE = "vllm.v1.executor.multiproc_executor"
# Releases whose worker creates its step queue in `WorkerProc._init_message_queues`, after the
# plugins are loaded, with the reader's busy loop in `_spin_condition.busy_loop_s` (read from
# their source).
KNOWN_VERSIONS = frozenset({"0.32.0"})
_MARK = "__grm_worker_busy_loop__"


def busy_loop_s(env: Mapping[str, str]) -> float | None:
    """The value the engine profile set, or None (unset, or not a number >= 0: vLLM's own)."""
    raw = env.get(WORKER_BUSY_LOOP_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        logger.warning("%s=%r is not a number of seconds >= 0: vLLM's busy loop is kept",
                       WORKER_BUSY_LOOP_ENV, raw)
        return None
    return value


def install(env: Mapping[str, str], vllm_version: str | None) -> str:
    """Shorten the worker's busy loop where `env` asks for it; say what was done."""
    seconds = busy_loop_s(env)
    if seconds is None:
        return "worker busy loop: vLLM's"
    if (vllm_version or "").split("+", 1)[0] not in KNOWN_VERSIONS:
        return f"worker busy loop: vLLM's (vLLM {vllm_version} is not a known release)"
    executor = sys.modules.get(EXECUTOR_MODULE)
    if executor is None:  # not a worker: this process never creates a worker's queues
        return "worker busy loop: no worker here"
    worker = getattr(executor, "WorkerProc", None)
    original = getattr(worker, "_init_message_queues", None)
    if worker is None or not callable(original):
        return f"worker busy loop: vLLM's ({EXECUTOR_MODULE} has another layout)"
    if not getattr(original, _MARK, False):
        worker._init_message_queues = _shortened(original, seconds)
    return f"worker busy loop: {seconds:g} s"


def _shortened(original: Callable[..., None], seconds: float) -> Callable[..., None]:
    @functools.wraps(original)
    def _init_message_queues(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        set_busy_loop(getattr(self, "rpc_broadcast_mq", None), seconds)

    setattr(_init_message_queues, _MARK, True)
    return _init_message_queues


def set_busy_loop(queue: object, seconds: float) -> bool:
    """Set a step queue's reader busy loop; False (and a log line) where it has none."""
    condition: Any = getattr(queue, "_spin_condition", None)
    if not getattr(condition, "is_reader", False) or not hasattr(condition, "busy_loop_s"):
        logger.warning("the worker's step queue has no reader busy loop here: vLLM's is kept")
        return False
    condition.busy_loop_s = seconds
    return True
