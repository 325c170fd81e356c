"""`nvidia-smi -L` and CUDA_VISIBLE_DEVICES, read as CUDA reads them."""

from __future__ import annotations

import pytest

from grm_service.gpus import Gpu, Mig, parse_listing, visible_devices

# `nvidia-smi -L` on a host with an H200, an A100 split into two MIG slices, and another H200.
LISTING = """\
GPU 0: NVIDIA H200 (UUID: GPU-8f2c1a4e-0000-1111-2222-333344445555)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-1b7d9e20-aaaa-bbbb-cccc-ddddeeeeffff)
  MIG 3g.40gb     Device  0: (UUID: MIG-5e6f7a8b-1234-5678-9abc-def012345678)
  MIG 2g.20gb     Device  1: (UUID: MIG-9a0b1c2d-1234-5678-9abc-def012345678)
GPU 2: NVIDIA H200 (UUID: GPU-c3d4e5f6-0000-1111-2222-333344445555)
"""


def test_listing_keeps_index_name_uuid_and_mig_slices() -> None:
    gpus = parse_listing(LISTING + "garbage line\n")
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[1] == Gpu(1, "NVIDIA A100-SXM4-80GB", "GPU-1b7d9e20-aaaa-bbbb-cccc-ddddeeeeffff", (
        Mig("3g.40gb", "MIG-5e6f7a8b-1234-5678-9abc-def012345678"),
        Mig("2g.20gb", "MIG-9a0b1c2d-1234-5678-9abc-def012345678")))
    assert parse_listing("") == ()


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (None, ["NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA H200"]),
        ("0", ["NVIDIA H200"]),
        ("2", ["NVIDIA H200"]),
        ("1", ["NVIDIA A100-SXM4-80GB"]),
        ("2,0", ["NVIDIA H200", "NVIDIA H200"]),
        (" 0 , 2 ", ["NVIDIA H200", "NVIDIA H200"]),
        ("GPU-c3d4e5f6-0000-1111-2222-333344445555", ["NVIDIA H200"]),
        ("GPU-c3d4", ["NVIDIA H200"]),  # a unique prefix, as CUDA takes it
        ("GPU-", []),  # ambiguous: CUDA stops there
        ("MIG-9a0b1c2d-1234-5678-9abc-def012345678", ["NVIDIA A100-SXM4-80GB MIG 2g.20gb"]),
        ("0,7,2", ["NVIDIA H200"]),  # CUDA stops at the first entry that names no device
        ("", []),
        ("-1", []),
    ],
)
def test_visible_devices_follow_cuda_rules(mask: str | None, names: list[str]) -> None:
    assert visible_devices(parse_listing(LISTING), mask) == names
