"""A random-weight Qwen2ForSequenceClassification with Qwen2-1.5B shapes and one label (a scalar
reward head), for the pooling measurements on the GPU machine. Offline: the tokenizer is the
device kit's (`/tmp/vstage/tok`, see ../shared/device/README.md).

    python3 benchmarks/gpu/make_classifier.py /tmp/vstage/tok /tmp/models/cls
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tok", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    started = time.time()
    tok = AutoTokenizer.from_pretrained(args.tok)
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=4096,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=False, num_labels=1, id2label={0: "reward"},
        label2id={"reward": 0}, pad_token_id=pad, bos_token_id=pad,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = Qwen2ForSequenceClassification._from_config(config, dtype=torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.normal_(0.0, 0.02, generator=gen)
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    template = args.tok / "chat_template.jinja"
    if template.exists() and not (args.out / "chat_template.jinja").exists():
        shutil.copy(template, args.out)
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"model": str(args.out), "params": params, "device": device,
                      "seconds": round(time.time() - started, 1)}))


if __name__ == "__main__":
    main()
