"""Seeded top-p sampling is batch-invariant under VLLM_BATCH_INVARIANT=1 with our plugin (issue 8).

Needs a CUDA GPU, vllm, this project's entry point installed (so vLLM finds the plugin) and a
model: GRM_GPU_MODEL=/path. GRM_GPU_RESULTS=file.json records the counts; GRM_GPU_BENCH_OUT=
file.json also starts a plain (BI=0) server and measures throughput on all of them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gpu import vllm_probe as probe
from tests.support.procs import Proc

REQUESTS = 32


def _why_skip() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    if shutil.which("nvidia-smi") is None:
        return "no CUDA GPU"
    plugins = importlib.metadata.entry_points(group="vllm.general_plugins")
    if "grm_service" not in {plugin.name for plugin in plugins}:
        return "grm_service's vllm.general_plugins entry point is not installed"
    if not os.environ.get("GRM_GPU_MODEL"):
        return "GRM_GPU_MODEL is not set"
    return None


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(_why_skip() is not None, reason=str(_why_skip())),
]

SPECS = {
    "plugin": {"VLLM_BATCH_INVARIANT": "1"},
    "no_plugin": {"VLLM_BATCH_INVARIANT": "1", "GRM_VLLM_PLUGIN": "off"},
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Proc]]:
    specs = dict(SPECS)
    if os.environ.get("GRM_GPU_BENCH_OUT"):
        specs["plain"] = {"VLLM_BATCH_INVARIANT": "0"}
    work = Path(os.environ.get("GRM_GPU_LOG_DIR") or tmp_path_factory.mktemp("vllm"))
    with probe.running(specs, os.environ["GRM_GPU_MODEL"], work) as procs:
        yield procs


def _record(key: str, value: Any) -> None:
    path = os.environ.get("GRM_GPU_RESULTS")
    if not path:
        return
    results = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    Path(path).write_text(json.dumps(results | {key: value}, indent=2))


def _phases(url: str) -> dict[str, dict[str, int]]:
    """Compare 1-at-a-time against all-at-once, twice (the second run hits the prefix cache)."""
    payloads = probe.seeded_requests(REQUESTS)
    alone = probe.one_at_a_time(url, payloads)
    batched = probe.all_at_once(url, payloads)
    again = probe.all_at_once(url, payloads)
    return {
        "alone_vs_batched": probe.differing(alone, batched),
        "alone_vs_batched_again": probe.differing(alone, again),
    }


def test_plugin_makes_seeded_top_p_batch_invariant(servers: dict[str, Proc]) -> None:
    counts = _phases(servers["plugin"].url)
    _record("plugin", counts)

    assert all(phase == {"texts": 0, "logprobs": 0} for phase in counts.values()), counts


def test_without_plugin_records_mismatches(servers: dict[str, Proc]) -> None:
    # Recorded, not asserted: the split sampler differs only when a draw lands on the edge.
    counts = _phases(servers["no_plugin"].url)
    _record("no_plugin", counts)


def test_plugin_ran_in_every_vllm_process(servers: dict[str, Proc]) -> None:
    active = probe.plugin_lines(servers["plugin"].log)
    idle = probe.plugin_lines(servers["no_plugin"].log)
    _record("plugin_log_lines", {"plugin": active, "no_plugin": idle})

    assert any("Triton kernel at every batch size" in line for line in active), active
    assert idle, "the plugin did not load in the no_plugin server"
    assert all("GRM_VLLM_PLUGIN=off" in line for line in idle), idle


@pytest.mark.skipif(not os.environ.get("GRM_GPU_BENCH_OUT"), reason="GRM_GPU_BENCH_OUT not set")
def test_throughput(servers: dict[str, Proc]) -> None:
    results = {name: probe.throughput(proc.url, 256, 128) for name, proc in servers.items()}
    Path(os.environ["GRM_GPU_BENCH_OUT"]).write_text(json.dumps(results, indent=2))

    assert all(result["requests_per_s"] > 0 for result in results.values())
