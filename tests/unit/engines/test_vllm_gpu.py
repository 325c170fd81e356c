"""Where the GPU profile puts each replica: `--gpus`, tensor parallelism, shared GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from grm_service.config import Settings
from grm_service.engines import ReplicaSpec, VllmGpu


def placements(replicas: int, gpus: str, *engine_args: str) -> list[tuple[int, ...]]:
    engine = VllmGpu(Settings(model="m", replicas=replicas, gpus=gpus,  # type: ignore[arg-type]
                              engine_args=list(engine_args)))
    return [engine.gpu_set(i) for i in range(replicas)]


@pytest.mark.parametrize(
    ("replicas", "gpus", "args", "expected"),
    [
        (2, "0,1", (), [(0,), (1,)]),  # serve --replicas 2 --gpus 0,1
        (1, "0,1", ("--tensor-parallel-size", "2"), [(0, 1)]),  # one TP=2 replica on both
        (1, "0,1", ("-tp=2",), [(0, 1)]),
        (2, "0,1,2,3", ("--tensor-parallel-size=2",), [(0, 1), (2, 3)]),
        (2, "0,0", (), [(0,), (0,)]),  # two replicas sharing one GPU
        (3, "0,1", (), [(0,), (1,), (0,)]),  # more replicas than GPUs: wrap
        (2, "3,1", (), [(3,), (1,)]),  # the ids as given, in the order given
    ],
)
def test_replica_i_takes_the_next_tp_gpus(replicas: int, gpus: str, args: tuple[str, ...],
                                          expected: list[tuple[int, ...]]) -> None:
    assert placements(replicas, gpus, *args) == expected


@pytest.mark.parametrize("gpus", ["0", "1,1"])
def test_a_tp_replica_never_gets_one_gpu_twice(gpus: str) -> None:
    with pytest.raises(ValidationError, match="tensor-parallel-size 2 needs 2 distinct GPUs"):
        Settings(model="m", gpus=gpus, engine_args=["--tensor-parallel-size", "2"])  # type: ignore[arg-type]


def test_replica_env_pins_its_gpus_in_nvidia_smi_order() -> None:
    engine = VllmGpu(Settings(model="m", replicas=2, gpus="0,1"))  # type: ignore[arg-type]
    spec = ReplicaSpec(name="r1", index=1, port=8001, work_dir=Path("/w/r1"),
                       gpus=engine.gpu_set(1))
    env = engine.command(spec, {"PATH": "/bin"}).env
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    tp2 = VllmGpu(Settings(model="m", gpus="0,1",  # type: ignore[arg-type]
                           engine_args=["--tensor-parallel-size", "2"]))
    spec = ReplicaSpec(name="r0", index=0, port=8000, work_dir=Path("/w/r0"), gpus=tp2.gpu_set(0))
    command = tp2.command(spec, {"PATH": "/bin"})
    assert command.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert command.argv[command.argv.index("--tensor-parallel-size") + 1] == "2"
