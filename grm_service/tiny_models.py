"""Tiny random-weight models, built offline and cached, for tests and benchmarks on any machine.

No model hub is reachable in CI, so each model is made here from a transformers config with
seeded random weights and a byte-level BPE tokenizer trained on a corpus generated in code (not
on files of the Python install, so the same builder makes the same bytes everywhere).

* `text`: Qwen2ForCausalLM, 2 layers, hidden 256, 4 heads, 2 KV heads.
* `vlm`: Qwen2VLForConditionalGeneration with the same text part and a 2-block vision tower,
  plus the preprocessor config that vLLM needs to serve images.
* `classifier`: Qwen2ForSequenceClassification with one label, a reward model that vLLM serves
  on `/pooling` and `/classify`.
* `vlm-reward`: the `vlm` model with a two-label score head (HPSv3's shape; `tiny_vlm_reward`).
* `clip`, `siglip`: dual encoders that vLLM serves on `/v1/embeddings` (`tiny_dual.py`).

The weights use init range 0.3, so that different prompts give visibly different outputs, and are
saved as fp32 safetensors. A folder is built in a temporary directory and renamed into place, so
concurrent builders never see half a model.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from grm_service.engine_side import compat

logger = logging.getLogger(__name__)

ModelKind = Literal["text", "vlm", "classifier", "vlm-reward", "clip", "siglip"]
MODEL_KINDS: tuple[ModelKind, ...] = get_args(ModelKind)

# Part of the cache key: bump it whenever a change here changes the files that are built.
BUILDER_VERSION = 1
SEED = 1234
VOCAB_SIZE = 4096
INIT_RANGE = 0.3

PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
VISION_TOKENS = (
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, *VISION_TOKENS)

# ChatML. Content is a string or a list of OpenAI-style parts; because the template loops over
# the parts, vLLM hands them over unflattened and each image becomes one <|image_pad|>, which the
# Qwen2-VL processor expands to one token per merged patch.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ['image', 'image_url'] %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] in ['video', 'video_url'] %}"
    "{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Qwen2-VL: 14-pixel patches, 2x2 merge, so a 224x224 image becomes 64 image tokens; images are
# scaled to stay within [MIN_PIXELS, MAX_PIXELS] so that prompts fit --max-model-len 512.
MIN_PIXELS = 56 * 56
MAX_PIXELS = 224 * 224
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

_TEXT_DIMS: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "initializer_range": INIT_RANGE,
    "rms_norm_eps": 1e-6,
}


def default_cache_dir() -> Path:
    """`$GRM_CACHE_DIR/tiny-models`, else `~/.cache/grm-service/tiny-models`."""
    root = os.environ.get("GRM_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "grm-service"
    return base / "tiny-models"


def ensure_tiny_model(kind: ModelKind, cache_dir: Path | None = None) -> Path:
    """Return the folder of the tiny model `kind`, building it first if it is not cached."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown tiny model kind {kind!r}; expected one of {MODEL_KINDS}")
    root = cache_dir if cache_dir is not None else default_cache_dir()
    target = root / f"{kind}-b{BUILDER_VERSION}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache may be shared by several users.
    try:
        build_tiny_model(kind, staging)
        _publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _publish(staging: Path, target: Path) -> None:
    try:
        staging.rename(target)
    except OSError:
        # Another process won the race; its folder is complete because it was renamed whole.
        if not (target / "config.json").is_file():
            raise
        logger.info("tiny model %s was built concurrently; using that one", target)
        return
    logger.info("built tiny model %s", target)


def build_tiny_model(kind: ModelKind, out: Path) -> None:
    """Write the model files of `kind` into the existing, empty folder `out`."""
    if kind in ("clip", "siglip"):
        from grm_service.tiny_dual import build_dual_model

        build_dual_model("clip" if kind == "clip" else "siglip", out, training_corpus(2000))
        return
    tokenizer = build_tokenizer()  # the first import of transformers, hooks first
    tokenizer.save_pretrained(out)
    if kind == "text":
        _save_text_model(tokenizer, out)
    elif kind == "classifier":
        _save_classifier(tokenizer, out)
    elif kind == "vlm-reward":
        from grm_service.tiny_vlm_reward import save_vlm_reward

        save_vlm_reward(qwen2_vl_config(tokenizer), out, SEED, INIT_RANGE)
        _write_json(out / "preprocessor_config.json", _preprocessor_config())
    else:
        _save_vlm(tokenizer, out)
        _write_json(out / "preprocessor_config.json", _preprocessor_config())


def build_tokenizer() -> Any:
    """A byte-level BPE tokenizer with the Qwen chat special tokens and the ChatML template."""
    compat.install()  # before transformers decides which torch-family wheels it can use
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(training_corpus(), trainer=trainer)
    tokenizer_class: Any = PreTrainedTokenizerFast  # Untyped constructor.
    return tokenizer_class(
        tokenizer_object=bpe,
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        additional_special_tokens=list(VISION_TOKENS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


_SYLLABLES = tuple(
    consonant + vowel
    for consonant in ("", "b", "ch", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "st", "t")
    for vowel in ("a", "e", "i", "o", "u", "ou", "ea")
)
_PROSE = (
    "The reward model reads the prompt and the answer, then returns one score.",
    "A deterministic service gives the same output for the same input, every time.",
    "Transcribe the text in this image. Rate the response from 1 to 10.",
    "def score(prompt: str, answer: str) -> float:\n    return 0.0\n",
    "for index, value in enumerate(values):\n    if value > 0:\n        total += value\n",
    '{"role": "user", "content": "Hello, world!"} 0123456789 (a + b) * c / d - e',
)


def training_corpus(lines: int = 6000) -> Iterator[str]:
    """A seeded mix of fixed prose, code and pseudo-words: enough distinct pairs for 4096 merges."""
    rng = random.Random(SEED)
    for index in range(lines):
        words = [
            "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(4, 14))
        ]
        yield f"{_PROSE[index % len(_PROSE)]} {' '.join(words)}. {rng.randint(0, 99999)}\n"


def _token_ids(tokenizer: Any) -> dict[str, Any]:
    def token_id(token: str) -> int:
        return int(tokenizer.convert_tokens_to_ids(token))

    return {
        "vocab_size": len(tokenizer),
        "bos_token_id": token_id(BOS_TOKEN),
        "eos_token_id": token_id(EOS_TOKEN),
        "pad_token_id": token_id(PAD_TOKEN),
    }


def _save_text_model(tokenizer: Any, out: Path) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    fields = {**_TEXT_DIMS, **_token_ids(tokenizer), "tie_word_embeddings": False}
    config = Qwen2Config(**fields)
    _save_random_model(Qwen2ForCausalLM, config, out)


def _save_classifier(tokenizer: Any, out: Path) -> None:
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    # One label: a scalar reward. vLLM serves it on /pooling (the raw score) and /classify
    # (the score through a sigmoid, as "probs" of one class).
    fields = {
        **_TEXT_DIMS,
        **_token_ids(tokenizer),
        "tie_word_embeddings": False,
        "num_labels": 1,
        "id2label": {0: "reward"},
        "label2id": {"reward": 0},
    }
    config = Qwen2Config(**fields)
    _save_random_model(Qwen2ForSequenceClassification, config, out)


def _save_vlm(tokenizer: Any, out: Path) -> None:
    from transformers import Qwen2VLForConditionalGeneration

    _save_random_model(Qwen2VLForConditionalGeneration, qwen2_vl_config(tokenizer), out)


def qwen2_vl_config(tokenizer: Any) -> Any:
    """The tiny Qwen2-VL's config (`vlm`, and `vlm-reward`'s backbone)."""
    from transformers import Qwen2VLConfig

    ids = _token_ids(tokenizer)
    text_config = {
        **_TEXT_DIMS,
        **ids,
        # The three M-RoPE sections (time, height, width) must add up to head_dim / 2 = 32.
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1e6,
            "mrope_section": [8, 12, 12],
        },
    }
    vision_config = {
        "depth": 2,
        "embed_dim": 64,
        "num_heads": 2,
        "mlp_ratio": 2,
        "hidden_size": _TEXT_DIMS["hidden_size"],  # The merger projects into the text model.
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "initializer_range": INIT_RANGE,
    }
    fields = {
        **ids,
        "text_config": text_config,
        "vision_config": vision_config,
        "image_token_id": tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        "video_token_id": tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        "vision_start_token_id": tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        "vision_end_token_id": tokenizer.convert_tokens_to_ids("<|vision_end|>"),
        "tie_word_embeddings": False,
        "initializer_range": INIT_RANGE,
    }
    return Qwen2VLConfig(**fields)


def _save_random_model(model_class: Any, config: Any, out: Path) -> None:
    import torch

    config.dtype = "float32"
    torch.manual_seed(SEED)
    model = model_class(config).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)


def _preprocessor_config() -> dict[str, Any]:
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "do_resize": True,
        "do_rescale": True,
        "do_normalize": True,
        "do_convert_rgb": True,
        "rescale_factor": 1 / 255,
        "image_mean": list(CLIP_MEAN),
        "image_std": list(CLIP_STD),
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m grm_service.tiny_models KIND [--cache-dir D]`: build if needed, print the path."""
    parser = argparse.ArgumentParser(prog="python -m grm_service.tiny_models")
    parser.add_argument("kind", choices=MODEL_KINDS)
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    path = ensure_tiny_model(args.kind, args.cache_dir)
    sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
