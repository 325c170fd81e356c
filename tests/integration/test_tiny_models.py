"""grm_service.tiny_models: real tiny models built on disk, loaded back with transformers."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from grm_service import tiny_models
from grm_service.tiny_models import ModelKind, ensure_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cache_dir() -> Path:
    """The run's own cache, the one the engine tests load from: an earlier run or the engine
    tests may have built what it holds, and each kind must be byte for byte what a build here
    gives (`test_builds_are_byte_identical`)."""
    return tiny_models.default_cache_dir()


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> dict[ModelKind, Path]:
    """Every kind built anew, outside the run's cache, for `test_builds_are_byte_identical`.
    Built in the module's set-up, before the per-test os.environ check: a build asks torch's
    inductor for its cache folder, which sets TORCHINDUCTOR_CACHE_DIR in os.environ the first
    time (third-party, not our code)."""
    folder = tmp_path_factory.mktemp("rebuilt")
    return {kind: ensure_tiny_model(kind, folder) for kind in tiny_models.MODEL_KINDS}


@pytest.fixture(scope="module")
def built(cache_dir: Path, rebuilt: dict[ModelKind, Path]) -> dict[ModelKind, Path]:
    return {kind: ensure_tiny_model(kind, cache_dir) for kind in tiny_models.MODEL_KINDS}


@pytest.fixture(scope="module")
def vlm_processor(built: dict[ModelKind, Path]) -> Any:
    """Loaded once, before the per-test os.environ check: loading it imports OpenCV, whose
    `cv2/__init__.py` sets LD_LIBRARY_PATH in os.environ (third-party, not our code)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(built["vlm"])


def read_config(folder: Path) -> dict[str, object]:
    config: dict[str, object] = json.loads((folder / "config.json").read_text())
    return config


def safetensors_dtypes(path: Path) -> set[str]:
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    return {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}


def digest_folder(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_folders_are_cached_by_kind_and_builder_version(
    built: dict[ModelKind, Path], cache_dir: Path
) -> None:
    version = tiny_models.BUILDER_VERSION
    assert {kind: path.name for kind, path in built.items()} == {
        "text": f"text-b{version}",
        "vlm": f"vlm-b{version}",
        "classifier": f"classifier-b{version}",
        "vlm-reward": f"vlm-reward-b{version}",
        "clip": f"clip-b{version}",
        "siglip": f"siglip-b{version}",
    }
    assert {p.parent for p in built.values()} == {cache_dir}
    before = (built["text"] / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model("text", cache_dir) == built["text"]
    assert (built["text"] / "model.safetensors").stat().st_mtime_ns == before


@pytest.mark.parametrize(
    ("kind", "architecture"),
    [
        ("text", "Qwen2ForCausalLM"),
        ("vlm", "Qwen2VLForConditionalGeneration"),
        ("classifier", "Qwen2ForSequenceClassification"),
        ("vlm-reward", "Qwen2VLForSequenceClassification"),
    ],
)
def test_config_describes_a_tiny_fp32_untied_model(
    built: dict[ModelKind, Path], kind: ModelKind, architecture: str
) -> None:
    config = read_config(built[kind])
    assert config["architectures"] == [architecture]
    assert config["dtype"] == "float32"
    assert config["tie_word_embeddings"] is False
    text = config.get("text_config", config)
    assert isinstance(text, dict)
    assert (text["num_hidden_layers"], text["hidden_size"]) == (2, 256)
    assert (text["num_attention_heads"], text["num_key_value_heads"]) == (4, 2)
    assert text["initializer_range"] == tiny_models.INIT_RANGE
    assert text["vocab_size"] == tiny_models.VOCAB_SIZE
    assert safetensors_dtypes(built[kind] / "model.safetensors") == {"F32"}


@pytest.mark.parametrize(("kind", "architecture"), [("clip", "CLIPModel"),
                                                    ("siglip", "SiglipModel")])
def test_dual_encoders_tokenize_like_clip_and_leave_id_0_to_images(
    built: dict[ModelKind, Path], kind: ModelKind, architecture: str
) -> None:
    """vLLM's CLIP and SigLIP use token id 0 as the image placeholder, which must not be a
    special token; a text is wrapped in start and end tokens, pooled at the last one."""
    from transformers import AutoTokenizer

    from grm_service import tiny_dual

    assert read_config(built[kind])["architectures"] == [architecture]
    assert safetensors_dtypes(built[kind] / "model.safetensors") == {"F32"}
    tokenizer = AutoTokenizer.from_pretrained(built[kind])
    ids = tokenizer("a red bird on a wire").input_ids
    assert tokenizer.convert_ids_to_tokens([ids[0], ids[-1]]) == [tiny_dual.START_TOKEN,
                                                                  tiny_dual.END_TOKEN]
    assert 0 not in tokenizer.all_special_ids
    image_only = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    assert tokenizer.apply_chat_template(image_only, tokenize=False) == ""


def test_vlm_config_and_preprocessor(built: dict[ModelKind, Path]) -> None:
    config = read_config(built["vlm"])
    vision = config["vision_config"]
    text = config["text_config"]
    assert isinstance(vision, dict) and isinstance(text, dict)
    assert (vision["depth"], vision["embed_dim"], vision["hidden_size"]) == (2, 64, 256)
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    assert sum(text["rope_parameters"]["mrope_section"]) == head_dim // 2
    preprocessor = json.loads((built["vlm"] / "preprocessor_config.json").read_text())
    assert preprocessor["min_pixels"] == tiny_models.MIN_PIXELS
    assert preprocessor["max_pixels"] == tiny_models.MAX_PIXELS


def test_classifier_is_a_single_label_reward_model(built: dict[ModelKind, Path]) -> None:
    config = read_config(built["classifier"])
    assert config["id2label"] == {"0": "reward"}
    assert isinstance(config["pad_token_id"], int)


def test_vlm_reward_is_the_vlm_with_a_mu_sigma_score_head(built: dict[ModelKind, Path]) -> None:
    from safetensors import safe_open

    from grm_service.tiny_vlm_reward import HEAD

    config = read_config(built["vlm-reward"])
    assert config["id2label"] == {"0": "mu", "1": "sigma"} and config["num_labels"] == 2
    with safe_open(str(built["vlm-reward"] / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
        assert tuple(weights.get_slice(HEAD).get_shape()) == (2, 256)
    with safe_open(str(built["vlm"] / "model.safetensors"), "pt") as weights:
        vlm = set(weights.keys())
    assert names == (vlm - {"lm_head.weight"}) | {HEAD}, "the vlm, its LM head for a score head"
    preprocessor = (built["vlm-reward"] / "preprocessor_config.json").read_text()
    assert preprocessor == (built["vlm"] / "preprocessor_config.json").read_text()


def test_chat_template_renders_strings_and_parts(built: dict[ModelKind, Path]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built["text"])
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:,"}},
                {"type": "text", "text": "What is shown?"},
            ],
        },
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is shown?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert len(tokenizer.tokenize("<|image_pad|>")) == 1
    assert tokenizer.decode(tokenizer("def score(x): return 0.5").input_ids) == (
        "def score(x): return 0.5"
    )


def test_text_model_outputs_differ_per_prompt(built: dict[ModelKind, Path]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built["text"])
    model = AutoModelForCausalLM.from_pretrained(built["text"]).eval()
    with torch.no_grad():
        first, second = (
            model(**tokenizer(prompt, return_tensors="pt")).logits[0, -1].argmax().item()
            for prompt in ("Hello there, how are you?", "Rate this answer from 1 to 10.")
        )
    assert first != second


def test_classifier_scores_differ_per_input(built: dict[ModelKind, Path]) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built["classifier"])
    model = AutoModelForSequenceClassification.from_pretrained(built["classifier"]).eval()
    batch = tokenizer(["The answer is 4.", "The answer is 5."], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (2, 1)
    assert logits[0, 0].item() != logits[1, 0].item()


def test_vlm_processor_expands_an_image_to_its_patches(
    built: dict[ModelKind, Path], vlm_processor: Any
) -> None:
    from PIL import Image
    from transformers import Qwen2VLForConditionalGeneration

    processor = vlm_processor
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Read."}]}],
        add_generation_prompt=True,
    )
    inputs = processor(
        text=[text], images=[Image.new("RGB", (224, 224), "white")], return_tensors="pt"
    )
    image_token = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((inputs["input_ids"] == image_token).sum()) == 64  # 16x16 patches, 2x2 merge
    model = Qwen2VLForConditionalGeneration.from_pretrained(built["vlm"]).eval()
    assert model(**inputs).logits.shape[-1] == tiny_models.VOCAB_SIZE


def test_builds_are_byte_identical(built: dict[ModelKind, Path],
                                   rebuilt: dict[ModelKind, Path]) -> None:
    """Each kind as the run's cache holds it, which an earlier run or the engine tests may have
    built: a builder changed without its version gives other bytes here."""
    differ = [k for k in rebuilt if digest_folder(rebuilt[k]) != digest_folder(built[k])]
    assert not differ, (f"cached {differ} differ from a fresh build: a builder changed without "
                        f"BUILDER_VERSION (bump it), or remove them from {built[differ[0]].parent}")


def test_concurrent_builders_agree_and_leave_no_staging(tmp_path: Path) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO_ROOT), "HOME": str(tmp_path)}
    argv = [
        sys.executable,
        "-m",
        "grm_service.tiny_models",
        "classifier",
        "--cache-dir",
        str(tmp_path),
    ]
    builders = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [builder.communicate(timeout=300) for builder in builders]
    assert [builder.returncode for builder in builders] == [0, 0], outputs
    paths = {stdout.strip() for stdout, _ in outputs}
    assert paths == {str(tmp_path / f"classifier-b{tiny_models.BUILDER_VERSION}")}
    assert [p.name for p in tmp_path.iterdir()] == [Path(next(iter(paths))).name]


def test_default_cache_dir_follows_grm_cache_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GRM_CACHE_DIR", str(tmp_path))
    assert tiny_models.default_cache_dir() == tmp_path / "tiny-models"
    monkeypatch.delenv("GRM_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tiny_models.default_cache_dir() == tmp_path / ".cache" / "grm-service" / "tiny-models"


def test_unknown_kind_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tiny model kind"):
        ensure_tiny_model("audio", tmp_path)  # type: ignore[arg-type]
    assert not any(tmp_path.iterdir())


def test_main_prints_the_cached_path(
    built: dict[ModelKind, Path], cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tiny_models.main(["vlm", "--cache-dir", str(cache_dir)]) == 0
    assert capsys.readouterr().out == f"{built['vlm']}\n"
