"""The identity a replica reports, as the keeper compares it: each difference named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from grm_service.engine_side.identity import ReplicaIdentity
from tests.unit.replicas.test_keeper import identity


def test_identity_differences_name_the_part() -> None:
    a = ReplicaIdentity.model_validate(identity())
    b = ReplicaIdentity.model_validate(identity(engine_version="0.26.0", device="NVIDIA A100"))
    diffs = " ; ".join(a.differences(b))
    assert "engine version '0.25.0' != '0.26.0'" in diffs and "device" in diffs
    assert a.fingerprint_id(1) == ReplicaIdentity.model_validate(identity()).fingerprint_id(1)


SMI = """#!/bin/sh
# nvidia-smi of a host with two H200s and an A100 in MIG mode, for the two queries grm-service asks.
if [ "$1" = "-L" ]; then cat <<'END'
GPU 0: NVIDIA H200 (UUID: GPU-8f2c1a4e-0000-1111-2222-333344445555)
GPU 1: NVIDIA H200 (UUID: GPU-c3d4e5f6-0000-1111-2222-333344445555)
GPU 2: NVIDIA A100-SXM4-80GB (UUID: GPU-1b7d9e20-aaaa-bbbb-cccc-ddddeeeeffff)
  MIG 3g.40gb     Device  0: (UUID: MIG-5e6f7a8b-1234-5678-9abc-def012345678)
END
else printf 'NVIDIA H200, 580.159.04\\nNVIDIA H200, 580.159.04\\n'
     printf 'NVIDIA A100-SXM4-80GB, 580.159.04\\n'
fi
"""

DEVICES = """
import json, sys
from grm_service.engine_side.identity import device_of
print(json.dumps([device_of("vllm", json.loads(env)) for env in sys.argv[1:]]))
"""


def test_a_replica_on_gpu_1_names_the_device_a_replica_on_gpu_0_names(tmp_path: Path) -> None:
    """In a real process whose PATH finds a fake `nvidia-smi`: ids and UUIDs are placement."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(SMI)
    smi.chmod(0o755)
    masks = ["0", "1", "0,1", "GPU-c3d4e5f6-0000-1111-2222-333344445555", "GPU-8f2c",
             "2", "MIG-5e6f7a8b-1234-5678-9abc-def012345678", ""]
    envs = [json.dumps({"CUDA_VISIBLE_DEVICES": m, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
            for m in masks]
    env = {"PATH": f"{smi.parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())}
    out = subprocess.run([sys.executable, "-c", DEVICES, *envs], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    got = dict(zip(masks, json.loads(out), strict=True))
    h200 = "NVIDIA H200 (driver 580.159.04)"
    assert [got[m] for m in masks[:5]] == [h200] * 5, got
    assert got["2"] == "NVIDIA A100-SXM4-80GB (driver 580.159.04)"
    assert got["MIG-5e6f7a8b-1234-5678-9abc-def012345678"] == (
        "NVIDIA A100-SXM4-80GB MIG 3g.40gb (driver 580.159.04)")
    assert got[""] == "no-gpu-visible"


def test_tensor_parallel_size_is_reported_and_named_when_it_differs() -> None:
    tp1 = ReplicaIdentity.model_validate(identity())
    tp2 = ReplicaIdentity.model_validate(identity(tensor_parallel_size=2))
    assert tp2.tensor_parallel_size == 2
    assert "tensor-parallel size 1 != 2" in tp1.differences(tp2)
