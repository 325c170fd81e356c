"""How the settings read their words and which combinations they refuse: the bodies of the
`Settings` validators, each a plain function of the values it checks."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path

from grm_service.digits import decimal


def split_csv(value: object) -> object:
    """A comma-separated string, or a list of them: a repeated flag read from its env var comes as
    the variable split on whitespace, each piece maybe still holding commas."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return [part.strip() for item in value for part in item.split(",") if part.strip()]
    return value


def engine_words(value: object) -> object:
    """GRM_ENGINE_ARGS as one string: a JSON list of strings, or shell words. Never split on
    commas: an engine flag's JSON value has them (`--limit-mm-per-prompt '{"image": 8, "video":
    0}'`), and `--max-model-len 8192` must stay two argv tokens."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            words = json.loads(text)
        except ValueError as err:
            raise ValueError(f"starts with '[' but is not a JSON list ({err})") from None
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise ValueError("a JSON list of engine args must hold strings only")
        return words
    try:
        return shlex.split(text)
    except ValueError as err:
        raise ValueError(f"not shell words ({err}): quote values with spaces") from None


def engine_flags(words: list[str]) -> list[str]:
    """Engine args the service would misread: flags joined with commas (the form once
    documented would reach the engine as one bogus flag), and a key the gateway would not hold
    (every request refused with 401 by the replicas it launched)."""
    for word in words:
        if word.startswith("-") and ",-" in word:
            raise ValueError(f"{word!r:.80} joins flags with commas: engine args are shell "
                             "words (GRM_ENGINE_ARGS='--enforce-eager --max-num-seqs 8') or a "
                             "JSON list")
        if word == "--api-key" or word.startswith("--api-key="):
            raise ValueError("--api-key among the engine args: give the replicas' key in "
                             "GRM_REPLICA_API_KEY instead (an environment variable: a command "
                             "line is readable by every user of the host), so that the gateway "
                             "sends it and the replicas it launches require it")
    return words


def replica_urls(urls: list[str]) -> list[str]:
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"replica url {url!r} must start with http:// or https://")
    return [url.rstrip("/") for url in urls]


def check_limits(max_tokens_default: int, max_tokens_limit: int, max_image_bytes: int,
                 max_body_bytes: int, max_bytes_in_flight: int) -> None:
    """Limits that contradict each other would refuse what another limit promises."""
    if max_tokens_default > max_tokens_limit:
        raise ValueError(f"GRM_MAX_TOKENS_DEFAULT={max_tokens_default} exceeds "
                         f"GRM_MAX_TOKENS_LIMIT={max_tokens_limit}")
    # An image travels as base64 (4/3 of its bytes) inside a JSON body.
    needed = max_image_bytes * 4 // 3 + 64 * 1024
    if max_body_bytes < needed:
        raise ValueError(f"GRM_MAX_BODY_BYTES={max_body_bytes} cannot carry one image of "
                         f"GRM_MAX_IMAGE_BYTES={max_image_bytes} (base64): raise it to "
                         f"{needed} or lower the image limit")
    if max_bytes_in_flight < max_body_bytes:
        raise ValueError(f"GRM_MAX_BYTES_IN_FLIGHT={max_bytes_in_flight} is below "
                         f"GRM_MAX_BODY_BYTES={max_body_bytes}: one largest body would "
                         "never be admitted; raise it or lower the body limit")


def check_gpus_fit(tp: int, gpus: list[int]) -> None:
    """A replica takes `tensor-parallel-size` distinct GPUs of `--gpus` (it wraps around the
    list, so replicas may share GPUs, but one replica never takes the same GPU twice)."""
    distinct = len(set(gpus))
    if gpus and tp > distinct:
        raise ValueError(f"--tensor-parallel-size {tp} needs {tp} distinct GPUs per replica "
                         f"but --gpus {','.join(map(str, gpus))} lists {distinct}: list "
                         f"at least {tp} (e.g. --gpus {','.join(map(str, range(tp)))})")


def tensor_parallel_size(engine_args: Sequence[str]) -> int:
    """vLLM's `--tensor-parallel-size`/`-tp` among the engine args (the last one wins)."""
    tp = "1"
    for i, arg in enumerate(engine_args):
        if arg in ("--tensor-parallel-size", "-tp") and i + 1 < len(engine_args):
            tp = engine_args[i + 1]
        elif arg.startswith(("--tensor-parallel-size=", "-tp=")):
            tp = arg.split("=", 1)[1]
    parsed = decimal(tp)
    return 1 if parsed is None else parsed


def api_keys(given: list[str], file: Path | None) -> list[str]:
    """The keys given, and those of the file: one a line, `#` comments skipped."""
    keys = list(given)
    if file is not None:
        lines = file.read_text().splitlines()
        keys += [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return keys
