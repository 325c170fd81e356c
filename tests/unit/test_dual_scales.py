"""The dual encoder's scalars come from its checkpoint, not its config, and are the model's own."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest

from grm_service import tiny_dual
from grm_service.dual_scales import ScalesError, read_dual_scales, read_scalar
from grm_service.engine_side import compat
from grm_service.tiny_models import ensure_tiny_model


@pytest.fixture(scope="module")
def tiny_clip() -> Path:
    return ensure_tiny_model("clip")


def test_clip_scale_is_the_checkpoints_not_the_configs(tiny_clip: Path) -> None:
    config = json.loads((tiny_clip / "config.json").read_text())
    scales = read_dual_scales(str(tiny_clip))
    assert scales is not None and scales.architecture == "CLIPModel"
    assert scales.logit_scale == tiny_dual.CHECKPOINT_LOGIT_SCALE
    assert scales.logit_scale != pytest.approx(config["logit_scale_init_value"], abs=0.1)
    assert scales.logit_bias is None


def test_siglip_has_its_bias() -> None:
    scales = read_dual_scales(str(ensure_tiny_model("siglip")))
    assert scales is not None and scales.architecture == "SiglipModel"
    assert (scales.logit_scale, scales.logit_bias) == (tiny_dual.CHECKPOINT_LOGIT_SCALE,
                                                       tiny_dual.CHECKPOINT_LOGIT_BIAS)


@pytest.fixture(scope="module")
def clip_model(tiny_clip: Path) -> Any:
    """Loaded before the per-test os.environ check: importing torch sets
    TORCHINDUCTOR_CACHE_DIR in os.environ (third-party, not our code)."""
    compat.install()  # Before transformers: a broken torchvision breaks its model imports.
    from transformers import CLIPModel

    return CLIPModel.from_pretrained(tiny_clip).eval()


def test_the_scorers_formula_is_the_models_own(tiny_clip: Path, clip_model: Any) -> None:
    """transformers' logits_per_image from the same towers equals exp(scale) * cos."""
    import torch

    from grm_service.scoring.clip import logit

    model = clip_model
    torch.manual_seed(0)
    pixels = torch.randn(1, 3, tiny_dual.IMAGE_SIZE, tiny_dual.IMAGE_SIZE)
    ids = torch.tensor([[1022, 5, 17, 99, 1023]])
    with torch.no_grad():
        out = model(input_ids=ids, pixel_values=pixels)
    scales = read_dual_scales(str(tiny_clip))
    assert scales is not None
    mine = logit(scales, out.image_embeds[0].tolist(), out.text_embeds[0].tolist())
    assert mine == pytest.approx(float(out.logits_per_image[0, 0]), rel=1e-5)


def _safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


@pytest.mark.parametrize(("dtype", "raw", "value"), [
    ("F32", struct.pack("<f", 4.6052), struct.unpack("<f", struct.pack("<f", 4.6052))[0]),
    ("F16", struct.pack("<e", 4.6), struct.unpack("<e", struct.pack("<e", 4.6))[0]),
    ("BF16", struct.pack("<f", 4.625)[2:], 4.625),
    ("F64", struct.pack("<d", math.pi), math.pi),
])
def test_each_float_dtype_is_read_exactly(tmp_path: Path, dtype: str, raw: bytes,
                                          value: float) -> None:
    _safetensors(tmp_path / "model.safetensors",
                 {"w": ("F32", [2], b"\0" * 8), "logit_scale": (dtype, [], raw)})
    assert read_scalar(tmp_path, "logit_scale") == value


def test_sharded_checkpoints_and_refusals(tmp_path: Path) -> None:
    _safetensors(tmp_path / "b.safetensors", {"logit_scale": ("F32", [1], struct.pack("<f", 2))})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"logit_scale": "b.safetensors"}}))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["CLIPModel"]}))
    scales = read_dual_scales(str(tmp_path))
    assert scales is not None and scales.logit_scale == 2.0
    with pytest.raises(ScalesError, match="maps no tensor 'logit_bias'"):
        read_scalar(tmp_path, "logit_bias")
    _safetensors(tmp_path / "b.safetensors", {"logit_scale": ("F32", [2], b"\0" * 8)})
    with pytest.raises(ScalesError, match="not one scalar"):
        read_scalar(tmp_path, "logit_scale")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    assert read_dual_scales(str(tmp_path)) is None, "not a dual encoder"
    assert read_dual_scales("no-such/model-here", {"HF_HUB_CACHE": str(tmp_path)}) is None


def test_a_bin_checkpoint_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["CLIPModel"]}))
    with pytest.raises(ScalesError, match="convert it to safetensors"):
        read_dual_scales(str(tmp_path))
