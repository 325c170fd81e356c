"""Two replicas on one GPU start one after the other (`Keeper._start_lanes`), on a real GPU.

vLLM sizes its KV cache from the memory free while it profiles: two replicas profiling at once on
one GPU each see the other's allocations, and one can fail with "No available memory for the
cache blocks" (seen on an H200 with two replicas at 0.17 each). The keeper holds a lane per GPU
from a replica's start to its first healthy probe. This starts `serve --engine vllm --replicas 2
--gpus 0`, watches `/ready` every quarter second, and asserts that r1 waited for r0's start, that
r1's process began only once r0's engine had started, and that both came up without a restart.

Env: GRM_GPU_MODEL (a model folder), GRM_GPU_MEM (gpu-memory-utilization per replica, default
0.17), GRM_GPU_ENGINE_ARGS (extra, e.g. "--enforce-eager").
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.procs import start_gateway

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None or not os.environ.get("GRM_GPU_MODEL"),
                       reason="needs a CUDA GPU, vllm and GRM_GPU_MODEL"),
]

WAITING = "waiting for another replica's start on GPU 0"
START_LIMIT_S = 900.0


def _replicas(url: str) -> dict[str, dict[str, Any]]:
    try:
        answer = httpx.get(url + "/ready", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return {r["name"]: r for r in answer.get("replicas", [])}


def test_replicas_on_one_gpu_start_one_after_the_other(tmp_path: Path) -> None:
    extra = os.environ.get("GRM_GPU_ENGINE_ARGS", "").split()
    gw = start_gateway(tmp_path, "--model", os.environ["GRM_GPU_MODEL"], "--engine", "vllm",
                       "--replicas", "2", "--gpus", "0", "--max-model-len", "2048", "--",
                       "--gpu-memory-utilization", os.environ.get("GRM_GPU_MEM", "0.17"),
                       *extra)
    seen: list[tuple[float, dict[str, dict[str, Any]]]] = []
    started = time.monotonic()
    try:
        while time.monotonic() - started < START_LIMIT_S:
            assert gw.popen.poll() is None, f"the gateway exited:\n{gw.tail()}"
            now = _replicas(gw.url)
            if not seen or now != seen[-1][1]:
                seen.append((round(time.monotonic() - started, 2), now))
            if len(now) == 2 and all(r["state"] == "ready" for r in now.values()):
                break
            time.sleep(0.25)
        timeline = "\n".join(f"{t:7.2f} {states}" for t, states in seen)
        final = seen[-1][1] if seen else {}
        assert final and all(r["state"] == "ready" for r in final.values()), timeline
        assert all(r["restarts"] == 0 for r in final.values()), timeline
        waited = [states for _, states in seen
                  if states.get("r1", {}).get("detail") == WAITING]
        assert waited, f"r1 never waited for r0's start:\n{timeline}"
        # While r1 waited, r0 was on its way up, never yet ready.
        assert all(s["r0"]["state"] in ("starting", "checking") for s in waited), timeline
        first_r1_pid = next(i for i, (_, s) in enumerate(seen) if s.get("r1", {}).get("pid"))
        first_r0_check = next(i for i, (_, s) in enumerate(seen)
                              if s.get("r0", {}).get("state") in ("checking", "ready"))
        assert first_r0_check <= first_r1_pid, timeline
    finally:
        gw.stop(timeout=120)
