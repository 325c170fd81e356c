"""Which NVIDIA devices a process sees: `nvidia-smi -L`, read the way CUDA reads its mask.

`CUDA_VISIBLE_DEVICES` may hold GPU indices (`0,1`), GPU UUIDs (`GPU-8f2...`, or a unique prefix
of one) or MIG instance UUIDs (`MIG-...`). CUDA takes the entries in order and stops at the first
one that names no device; an empty mask hides every GPU. The indices here are nvidia-smi's (PCI
bus order): a replica launched by grm-service gets `CUDA_DEVICE_ORDER=PCI_BUS_ID` so that CUDA
counts the same way.

A device is named by its model, plus its MIG profile for a MIG slice (a slice has fewer SMs than
the whole GPU, which kernels that split work by SM count can see). Ids and UUIDs are placement and
never part of the name: two replicas of one model on GPU 0 and GPU 1 of a host name the same
device.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from grm_service.digits import decimal

_GPU_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[^)\s]+)\)\s*$")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)\s]+)\)\s*$")


@dataclass(frozen=True)
class Mig:
    profile: str  # e.g. "3g.71gb"
    uuid: str


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    migs: tuple[Mig, ...] = ()


def parse_listing(text: str) -> tuple[Gpu, ...]:
    """The GPUs and MIG instances of `nvidia-smi -L`, in its order; unknown lines are skipped."""
    gpus: list[Gpu] = []
    for line in text.splitlines():
        gpu = _GPU_LINE.match(line)
        mig = _MIG_LINE.match(line)
        if gpu:
            gpus.append(Gpu(int(gpu.group(1)), gpu.group(2).strip(), gpu.group(3)))
        elif mig and gpus:
            last = gpus[-1]
            gpus[-1] = Gpu(last.index, last.name, last.uuid,
                           (*last.migs, Mig(mig.group(1), mig.group(2))))
    return tuple(gpus)


def _resolve(entry: str, gpus: Sequence[Gpu]) -> str | None:
    """The device name one mask entry selects, or None where CUDA would stop."""
    index = decimal(entry)
    if index is not None:
        found = [g for g in gpus if g.index == index]
        return found[0].name if found else None
    if entry.startswith("GPU-"):
        found = [g for g in gpus if g.uuid.startswith(entry)]
        return found[0].name if len(found) == 1 else None
    if entry.startswith("MIG-"):
        migs = [(g, m) for g in gpus for m in g.migs if m.uuid.startswith(entry)]
        return f"{migs[0][0].name} MIG {migs[0][1].profile}" if len(migs) == 1 else None
    return None


def visible_devices(gpus: Sequence[Gpu], mask: str | None) -> list[str]:
    """The name of each device CUDA shows under `CUDA_VISIBLE_DEVICES=mask` (None: unset)."""
    if mask is None:
        return [g.name for g in gpus]
    names: list[str] = []
    for entry in (part.strip() for part in mask.split(",")):
        name = _resolve(entry, gpus)
        if name is None:
            break
        names.append(name)
    return names
