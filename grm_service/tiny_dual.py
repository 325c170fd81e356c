"""Tiny random-weight dual encoders (CLIP, SigLIP), built offline, for the `clip` scorer's tests.

Each is a two-tower model that vLLM serves as an embedding model (`CLIPModel` ->
`CLIPEmbeddingModel`, `SiglipModel` -> `SiglipEmbeddingModel`): text on `/v1/embeddings` with
`input`, an image with chat-style `messages`. The tokenizer is a byte-level BPE trained on the
corpus of `tiny_models` (so the same builder makes the same bytes everywhere), wrapped in
`<|startoftext|> ... <|endoftext|>` as CLIP's own is, its special tokens last so that id 0
(vLLM's image placeholder for these models) is an ordinary token.

`logit_scale` (and SigLIP's `logit_bias`) are saved with values other than the config's initial
ones, so that a test can tell a scorer that reads the checkpoint from one that reads the config.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from grm_service.engine_side import compat

DualKind = Literal["clip", "siglip"]
SEED = 4321
VOCAB_SIZE = 1024
IMAGE_SIZE = 32
PATCH_SIZE = 8
MAX_TEXT_TOKENS = 77
START_TOKEN = "<|startoftext|>"
END_TOKEN = "<|endoftext|>"
# What the checkpoint holds, unlike the configs' initial values (CLIP: log(1/0.07) ~= 2.659;
# SigLIP: log(10) and -10): exp(3.25) ~= 25.8.
CHECKPOINT_LOGIT_SCALE = 3.25
CHECKPOINT_LOGIT_BIAS = -7.5

# Only text parts are rendered: an image-only message is an empty (all-special) prompt, the one
# shape vLLM's CLIP and SigLIP processors accept with an image.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}"
)
_TOWER: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}


def build_dual_model(kind: DualKind, out: Path, corpus: Iterable[str]) -> None:
    """Write the model files of `kind` into the existing, empty folder `out`; the tokenizer is
    trained on `corpus` (`tiny_models.training_corpus`, so every builder makes the same bytes)."""
    tokenizer = _tokenizer(corpus)  # the first import of transformers, hooks first
    model = _clip(tokenizer) if kind == "clip" else _siglip(tokenizer)
    model.save_pretrained(out, safe_serialization=True)
    _processor(kind, tokenizer).save_pretrained(out)


def _tokenizer(corpus: Iterable[str]) -> Any:
    # Before transformers, in whatever process calls this: transformers decides at its first
    # import whether torchvision and torchaudio are usable, and a broken wheel then breaks its
    # model imports for the rest of the process (a test's, too).
    compat.install()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - 2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(corpus, trainer=trainer)
    bpe.add_special_tokens([START_TOKEN, END_TOKEN])
    start, end = bpe.token_to_id(START_TOKEN), bpe.token_to_id(END_TOKEN)
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{START_TOKEN} $A {END_TOKEN}", special_tokens=[(START_TOKEN, start),
                                                                (END_TOKEN, end)])
    tokenizer_class: Any = PreTrainedTokenizerFast  # Untyped constructor.
    return tokenizer_class(tokenizer_object=bpe, bos_token=START_TOKEN, eos_token=END_TOKEN,
                           pad_token=END_TOKEN, unk_token=None, chat_template=CHAT_TEMPLATE,
                           model_max_length=MAX_TEXT_TOKENS)


def _ids(tokenizer: Any) -> dict[str, int]:
    return {"vocab_size": len(tokenizer),
            "bos_token_id": int(tokenizer.convert_tokens_to_ids(START_TOKEN)),
            "eos_token_id": int(tokenizer.convert_tokens_to_ids(END_TOKEN)),
            "pad_token_id": int(tokenizer.convert_tokens_to_ids(END_TOKEN))}


def _clip(tokenizer: Any) -> Any:
    from transformers import CLIPConfig, CLIPModel

    # vLLM's CLIP needs the text width <= the projection width (both towers share one buffer),
    # and reads the projection width of the towers' own configs too.
    width = {"projection_dim": _TOWER["hidden_size"]}
    text = {**_TOWER, **_ids(tokenizer), **width, "max_position_embeddings": MAX_TEXT_TOKENS}
    vision = {**_TOWER, **width, "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE}
    config = CLIPConfig(text_config=text, vision_config=vision, **width)
    return _random(CLIPModel, config, {"logit_scale": CHECKPOINT_LOGIT_SCALE})


def _siglip(tokenizer: Any) -> Any:
    from transformers import SiglipConfig, SiglipModel

    text = {**_TOWER, **_ids(tokenizer), "max_position_embeddings": MAX_TEXT_TOKENS,
            "projection_size": _TOWER["hidden_size"]}
    vision = {**_TOWER, "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE}
    config = SiglipConfig(text_config=text, vision_config=vision)
    return _random(SiglipModel, config, {"logit_scale": CHECKPOINT_LOGIT_SCALE,
                                         "logit_bias": CHECKPOINT_LOGIT_BIAS})


def _random(model_class: Any, config: Any, scalars: dict[str, float]) -> Any:
    import torch

    config.dtype = "float32"
    torch.manual_seed(SEED)
    model = model_class(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, value in scalars.items():
            getattr(model, name).fill_(value)
    return model


def _processor(kind: DualKind, tokenizer: Any) -> Any:
    import transformers

    # Untyped constructors, hence Any.
    lib: Any = transformers
    square = {"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    if kind == "clip":
        image = lib.CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE}, crop_size=square)
        return lib.CLIPProcessor(image_processor=image, tokenizer=tokenizer)
    return lib.SiglipProcessor(image_processor=lib.SiglipImageProcessor(size=square),
                               tokenizer=tokenizer)
