"""Reproducibility fingerprints: model hash, env digest, request/response digests.

A fingerprint id names everything that decides a replica's output bits apart from the request:
the seed, the model's files and the numerics-relevant environment. Two responses with the same
fingerprint id and request digest must have the same response digest; if they do not, the
service was nondeterministic.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import blake3
from pydantic import BaseModel, Field

from grm_service.canonical import canonical_json, canonical_value

log = logging.getLogger(__name__)

_SKIP_DIRS = {".git", ".cache", "__pycache__", ".huggingface"}
_SKIP_SUFFIXES = {".md", ".lock", ".metadata"}
_CACHE_FILE = "model-hash.json"
_HASH_VERSION = 1


# `digest().hex()` rather than `hexdigest()`: the same text at half the CPU (blake3's own
# hexdigest builds its string a character at a time); two of them on every answer.
def digest(data: bytes, length: int = 32) -> str:
    return blake3.blake3(data).digest()[:(length + 1) // 2].hex()[:length]


def parts_digest(parts: Iterable[bytes | memoryview], length: int = 32) -> str:
    """`digest` of the concatenation of `parts`, without building it."""
    hasher = blake3.blake3()
    for part in parts:
        hasher.update(part)
    return hasher.digest()[:(length + 1) // 2].hex()[:length]


def json_digest(obj: Any, length: int = 32) -> str:
    return digest(canonical_json(obj), length)


def model_files(root: Path) -> list[Path]:
    """Every file that can change the model's numbers or its tokens, in a stable order."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in filenames:
            path = Path(dirpath) / name
            if path.suffix not in _SKIP_SUFFIXES and not name.startswith("."):
                files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _signature(root: Path, files: Iterable[Path]) -> list[list[object]]:
    sig: list[list[object]] = []
    for path in files:
        st = path.stat()
        sig.append([path.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns])
    return sig


def hash_files(root: Path, files: Iterable[Path]) -> str:
    """blake3 over (name, size, bytes) of each file, so renames and moves change the hash."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    for path in files:
        rel = path.relative_to(root).as_posix().encode()
        size = path.stat().st_size
        hasher.update(rel + b"\0" + str(size).encode() + b"\0")
        if size:
            hasher.update_mmap(path)
    return str(hasher.hexdigest())


def _load_cache(cache_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((cache_dir / _CACHE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("version") == _HASH_VERSION else {}


def _store_cache(cache_dir: Path, cache: dict[str, Any]) -> None:
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".{_CACHE_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(cache))
    tmp.replace(cache_dir / _CACHE_FILE)  # atomic: a racing reader sees old or new, never half


def model_hash(model: str, cache_dir: Path | None = None) -> str:
    """Content hash of a model folder, cached by (path, size, mtime) of each file.

    A name that is not a local folder (a hub id not yet downloaded) is hashed by name and marked
    `name:` so nobody mistakes it for a content hash.
    """
    root = Path(model).expanduser()
    if not root.is_dir():
        return "name:" + digest(model.encode())
    root = root.resolve()
    files = model_files(root)
    sig = _signature(root, files)
    cache = _load_cache(cache_dir) if cache_dir else {}
    entry = cache.get("models", {}).get(str(root))
    if entry and entry.get("signature") == sig:
        return str(entry["hash"])
    log.info("hashing model %s (%d files)", root, len(files))
    value = "blake3:" + hash_files(root, files)[:32]
    if cache_dir:
        cache.setdefault("models", {})[str(root)] = {"signature": sig, "hash": value}
        cache["version"] = _HASH_VERSION
        _store_cache(cache_dir, cache)
    return value


def env_digest(inputs: Mapping[str, Any]) -> str:
    return json_digest(dict(inputs), 16)


def fingerprint_id(seed: int, model_hash_value: str, env_digest_value: str) -> str:
    return "grm-" + digest(f"{seed}|{model_hash_value}|{env_digest_value}".encode(), 16)


def system_fingerprint(model_hash_value: str, env_digest_value: str) -> str:
    """OpenAI's `system_fingerprint`: the backend configuration alone. The seed is the
    request's to choose (OpenAI: use it "in conjunction with the seed request parameter"), so
    it is left out here and kept in the fingerprint id."""
    return "grm-sys-" + digest(f"{model_hash_value}|{env_digest_value}".encode(), 16)


def produced(payload: Mapping[str, Any]) -> Any:
    """What the model produced: each choice's content and logprobs, or, for a pooling/classify
    answer (no choices), its `data`, or, for a Responses API answer, its output items without
    their ids. Everything else of an answer (its id, its time) may differ between two
    computations of the same request."""
    if "choices" not in payload:
        if "data" in payload:
            return payload["data"]
        if isinstance(payload.get("output"), list):
            return [_without_id(item) for item in payload["output"]]
    choices = payload.get("choices") or []
    return [
        {
            "index": c.get("index"),
            "content": (c.get("message") or {}).get("content", c.get("text")),
            "logprobs": c.get("logprobs"),
        }
        for c in choices
        if isinstance(c, dict)
    ]


def response_digest(payload: Mapping[str, Any], decoded: bool = False) -> str:
    """THE output digest, over what the model produced (`produced`: each choice's index,
    content or a completion's `text`, logprobs; or a pooling answer's `data`). The served
    fingerprint, the canaries and `verify` all compare this one. `decoded`: msgspec's JSON
    decoder built `payload` (`canonical.canonical_value`)."""
    return digest(canonical_value(produced(payload), decoded))


def _without_id(item: Any) -> Any:
    """A Responses output item as produced: its `id` is drawn at random per answer."""
    if not isinstance(item, dict):
        return item
    return {key: value for key, value in item.items() if key != "id"}


class Fingerprint(BaseModel):
    """One response's fingerprint: fields of the serving replica's own `ReplicaIdentity`
    (engine_side/identity.py) for this seed, plus what was asked and answered, and where."""

    fingerprint_id: str
    identity: str
    seed: int
    model_hash: str | None
    env_digest: str | None
    engine: str
    engine_version: str
    device: str | None
    tensor_parallel_size: int | None = None
    replica: str
    serialized: bool
    request_digest: str
    response_digest: str
    # "hit": answered from the ledger; "coalesced": an identical request's computation in
    # flight. Absent where the answer was computed for this request.
    cache: str | None = Field(None, exclude_if=lambda value: value is None)

    def headers(self) -> dict[str, str]:
        return fingerprint_headers(vars(self))


def fingerprint_headers(fields: Mapping[str, Any]) -> dict[str, str]:
    """The response headers that carry a fingerprint (`Fingerprint`'s fields, as a mapping)."""
    return {**stamp_headers(fields), **answer_headers(fields)}


def stamp_headers(fields: Mapping[str, Any]) -> dict[str, str]:
    """The first of `fingerprint_headers`: those the replica's identity and the seed fix."""
    return {
        "x-grm-fingerprint": fields["fingerprint_id"],
        "x-grm-seed": str(fields["seed"]),
        "x-grm-replica": fields["replica"],
    }


def answer_headers(fields: Mapping[str, Any]) -> dict[str, str]:
    """The rest of `fingerprint_headers`: those of the answer itself."""
    return {
        "x-grm-request-digest": fields["request_digest"],
        "x-grm-response-digest": fields["response_digest"],
        **({"x-grm-cache": fields["cache"]} if fields.get("cache") else {}),
    }
