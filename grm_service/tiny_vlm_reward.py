"""The tiny VLM reward model (HPSv3's shape), built offline: `tiny_models` kind `vlm-reward`.

HPSv3 is a Qwen2-VL whose last hidden state goes through a small head to two values, the mean
and the spread of a preference score (mu, sigma). vLLM serves such a model through its pooling
runner: a config whose architecture is `Qwen2VLForSequenceClassification` makes vLLM wrap its
`Qwen2VLForConditionalGeneration` as a sequence classifier (`--convert classify` is implied by the
name) with a linear `score` head of `num_labels` outputs on the last token, answered on
`/classify` and `/pooling`. This builder writes exactly that: the tiny Qwen2-VL of `tiny_models`
(same tokenizer, text part and vision tower), without its LM head, plus a seeded random
score head (`HEAD`) of two labels named `mu` and `sigma`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ARCHITECTURE = "Qwen2VLForSequenceClassification"
LABELS = ("mu", "sigma")
# vLLM's name of the head: a converted VLM classifier keeps it on its language model, and the
# Qwen2-VL weight mapper leaves a name of that prefix as it is.
HEAD = "language_model.score.weight"


def save_vlm_reward(config: Any, out: Path, seed: int, init_range: float) -> None:
    """The classifier checkpoint of the tiny Qwen2-VL `config` into `out`, its weights drawn from
    `seed` (the tokenizer and preprocessor are the caller's)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen2VLForConditionalGeneration

    config.dtype = "float32"
    torch.manual_seed(seed)
    model_class: Any = Qwen2VLForConditionalGeneration  # untyped constructor
    model = model_class(config).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)
    # The LM head goes (a classifier has none); the score head comes from its own seed.
    weights_path = out / "model.safetensors"
    weights = {k: v for k, v in load_file(weights_path).items() if not k.startswith("lm_head.")}
    generator = torch.Generator().manual_seed(seed + 1)
    hidden = config.text_config.hidden_size
    weights[HEAD] = torch.randn(len(LABELS), hidden, generator=generator) * init_range
    save_file(weights, weights_path, metadata={"format": "pt"})
    _write_config(out / "config.json")


def _write_config(path: Path) -> None:
    config = json.loads(path.read_text(encoding="utf-8"))
    config["architectures"] = [ARCHITECTURE]
    config["num_labels"] = len(LABELS)
    config["id2label"] = {str(i): name for i, name in enumerate(LABELS)}
    config["label2id"] = {name: i for i, name in enumerate(LABELS)}
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
