"""A dual encoder's (CLIP, SigLIP) learned `logit_scale` and `logit_bias`, read from its checkpoint.

vLLM's embedding models load the two towers and drop these scalars (`ignore_unexpected_prefixes=
["logit_scale.", "logit_bias."]`), yet they are part of the model's score: PickScore is
`logit_scale.exp() * cos(image, text)`. The config's `logit_scale_init_value` is only the value
training started from (CLIP: log(1/0.07) = 2.659; PickScore's trained one is ~4.6), so the
scalars are read from the weights the service serves: the safetensors header names each
tensor's dtype and byte range, and the few bytes of the two scalars are read, nothing else.

The model is a folder, or a hub id already in the local hub cache (the replicas downloaded it);
nothing here reaches the network.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# The architectures whose score is `scale * cos (+ bias)`, and which scalars each must have.
DUAL_ENCODERS: dict[str, tuple[str, ...]] = {
    "CLIPModel": ("logit_scale",),
    "SiglipModel": ("logit_scale", "logit_bias"),
}
_FORMATS = {"F64": "<d", "F32": "<f", "F16": "<e"}
_MAX_HEADER = 100 * 1024 * 1024


class ScalesError(Exception):
    """The checkpoint is a dual encoder whose scalars cannot be read."""


@dataclass(frozen=True)
class DualScales:
    """`logit_scale` as stored (the log of the multiplier), `logit_bias` (SigLIP) or None."""

    architecture: str
    logit_scale: float
    logit_bias: float | None = None
    source: str = ""

    def describe(self) -> dict[str, Any]:
        return {"architecture": self.architecture, "logit_scale": self.logit_scale,
                "logit_bias": self.logit_bias}


def read_dual_scales(model: str, env: Mapping[str, str] | None = None) -> DualScales | None:
    """The scalars of `model` (a folder or a cached hub id); None when it is not a dual
    encoder or its files are not on this host; ScalesError when they should be and are not."""
    folder = _folder(model, os.environ if env is None else env)
    if folder is None:
        return None
    config = _json(folder / "config.json")
    arch = next((a for a in config.get("architectures") or [] if a in DUAL_ENCODERS), None)
    if arch is None:
        return None
    values = {name: read_scalar(folder, name) for name in DUAL_ENCODERS[arch]}
    return DualScales(arch, values["logit_scale"], values.get("logit_bias"), str(folder))


def read_scalar(folder: Path, name: str) -> float:
    """One scalar tensor of the checkpoint in `folder`, exactly as stored, as a float."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shard = _json(index).get("weight_map", {}).get(name)
        if shard is None:
            raise ScalesError(f"{index} maps no tensor {name!r}")
        return _scalar(folder / str(shard), name)
    single = folder / "model.safetensors"
    if not single.is_file():
        raise ScalesError(f"{folder} has no model.safetensors: the {name} of a .bin checkpoint "
                          "is not read here; convert it to safetensors")
    return _scalar(single, name)


def _scalar(path: Path, name: str) -> float:
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        if size > _MAX_HEADER:
            raise ScalesError(f"{path}: a safetensors header of {size} bytes")
        header = json.loads(f.read(size))
        entry = header.get(name)
        if entry is None:
            raise ScalesError(f"{path} holds no tensor {name!r}")
        start, end = entry["data_offsets"]
        if end - start != _width(entry["dtype"]) or any(d != 1 for d in entry["shape"]):
            raise ScalesError(f"{path}: {name} is not one scalar ({entry['shape']})")
        f.seek(8 + size + start)
        return _decode(entry["dtype"], f.read(end - start), f"{path}: {name}")


def _width(dtype: str) -> int:
    return {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}.get(dtype, -1)


def _decode(dtype: str, raw: bytes, where: str) -> float:
    if dtype == "BF16":  # the high half of a float32
        return float(struct.unpack("<f", b"\x00\x00" + raw)[0])
    if dtype not in _FORMATS:
        raise ScalesError(f"{where} has dtype {dtype}, not a float")
    return float(struct.unpack(_FORMATS[dtype], raw)[0])


def _json(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ScalesError(f"cannot read {path}: {err}") from err
    return loaded if isinstance(loaded, dict) else {}


def _folder(model: str, env: Mapping[str, str]) -> Path | None:
    folder = Path(model).expanduser()
    if folder.is_dir():
        return folder if (folder / "config.json").is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    cache = env.get("HF_HUB_CACHE") or (
        str(Path(env["HF_HOME"]) / "hub") if env.get("HF_HOME") else None)
    try:
        found = try_to_load_from_cache(model, "config.json", cache_dir=cache)
    except ValueError:  # not a hub id either
        return None
    return Path(found).parent if isinstance(found, str) else None
