"""What an engine profile is: how to start one replica and what it can guarantee."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from grm_service.config import Settings
from grm_service.engine_side.header_cache import INDUCTOR_CACHE_ENV
from grm_service.engine_side.identity import CACHE_DIR_ENV, MIDDLEWARE
from grm_service.host import distribution_version, remove_dead_owners
from grm_service.metrics import MULTIPROCESS_ENV

# vLLM reads its API key from here where `--api-key` is not given (vllm/envs.py).
REPLICA_KEY_ENV = "VLLM_API_KEY"

log = logging.getLogger(__name__)


POOLING_UNMEASURED = ("pooling (/classify, /pooling, /v1/embeddings) is not measured "
                      "batch-invariant on this engine: each such request runs alone on its replica")


@dataclass(frozen=True)
class Capabilities:
    """`batch_invariant`: requests may share a batch and still get the same bits.
    `sampling_invariant`: that also holds for top_p < 1 / top_k sampling.
    `pooling_invariant`: and for pooling (/classify, /pooling, /v1/embeddings), on an engine
    version where that was measured; each replica must still pass the pooling canary before it
    co-batches them. `pooling_note`: what was measured, where, and what the gateway does."""

    batch_invariant: bool
    sampling_invariant: bool
    note: str
    pooling_invariant: bool = False
    pooling_note: str = POOLING_UNMEASURED


@dataclass(frozen=True)
class ReplicaSpec:
    name: str
    index: int
    port: int
    work_dir: Path
    gpus: tuple[int, ...] = ()

    @property
    def tmp_dir(self) -> Path:
        """A short temp dir: vLLM puts ZeroMQ IPC sockets there, and a Unix socket path must fit
        in 107 bytes, which a deep work dir would overflow. The launching process's pid keeps two
        services that share a work dir from deleting each other's sockets."""
        return Path(tempfile.gettempdir()) / f"{self._tmp_prefix()}{os.getpid()}-{self.name}"

    def _tmp_prefix(self) -> str:
        tag = hashlib.blake2b(str(self.work_dir).encode(), digest_size=5).hexdigest()
        return f"grm-{tag}-"

    def sweep_stale_tmp(self) -> list[Path]:
        """Remove this replica's temp dirs whose launching process is gone: a `grm-service
        replica` becomes the engine and leaves nobody to remove its own, and a killed gateway
        leaves its replicas'. Those of a live process (another service on this work dir) stay."""
        return remove_dead_owners(Path(tempfile.gettempdir()), self._tmp_prefix(), self.name)


@dataclass(frozen=True)
class ChildCommand:
    """One replica's recipe: what to exec, with which environment, needing which folders.
    Built by the engine profile only, used by every launcher (local, Ray, `grm-service replica`)."""

    argv: list[str]
    env: dict[str, str]
    dirs: tuple[Path, ...]

    def make_dirs(self) -> None:
        for folder in self.dirs:
            folder.mkdir(parents=True, exist_ok=True)


class Engine(ABC):
    name: ClassVar[str]
    distribution: ClassVar[str]
    # The most tokens a scorer's request asks for where its batch sets no max_tokens (None:
    # the scorer's own, OCR 4096): where decoding is slow, the scorers' defaults make an item
    # take minutes. GRM_SCORE_MAX_TOKENS sets another.
    score_max_tokens: ClassVar[int | None] = None

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def version(self) -> str:
        return distribution_version(self.distribution, "vllm")

    @abstractmethod
    def capabilities(
        self, version: str | None = None, env: Mapping[str, str] | None = None
    ) -> Capabilities:
        """What the engine guarantees; `version` and `env` are the replica's own, when it
        reported them (else this host's)."""

    @abstractmethod
    def argv(self, spec: ReplicaSpec, host: str) -> list[str]: ...

    @abstractmethod
    def deterministic_env(self) -> dict[str, str]:
        """The environment every replica shares."""

    @abstractmethod
    def replica_env(self, spec: ReplicaSpec) -> dict[str, str]:
        """Per-replica placement (cores, GPUs, temp dirs): not numerics, not in the digest."""

    def command(
        self, spec: ReplicaSpec, base_env: Mapping[str, str], host: str = "127.0.0.1"
    ) -> ChildCommand:
        """The one child recipe. `base_env` is the launching process's environment (copied,
        never changed); the replica serves its own identity through the middleware."""
        argv = [*self.argv(spec, host), "--middleware", MIDDLEWARE]
        # A gateway worker's metrics folder: an engine writing its own metrics there would show
        # them in the gateway's /metrics (an engine_env entry still sets one on purpose).
        base_env = {k: v for k, v in base_env.items() if k != MULTIPROCESS_ENV}
        caches = {CACHE_DIR_ENV: str(self.settings.cache_dir),
                  "VLLM_CACHE_ROOT": str(self.vllm_cache())}
        env = {**base_env, **self.deterministic_env(),
               INDUCTOR_CACHE_ENV: str(self.inductor_cache()), **self.settings.engine_env,
               **self.replica_env(spec), **caches, **self.credentials()}
        return ChildCommand(argv, env, (spec.tmp_dir, self.vllm_cache(), self.inductor_cache()))

    def credentials(self) -> dict[str, str]:
        """The replicas' key (`GRM_REPLICA_API_KEY`), which vLLM reads where `--api-key` is not
        given: its OpenAI routes then refuse whoever lacks it (replicas/credentials.py)."""
        key = self.settings.replica_api_key
        return {REPLICA_KEY_ENV: key} if key else {}

    def vllm_cache(self) -> Path:
        """vLLM's cache (`VLLM_CACHE_ROOT`): the model class's inspection (a subprocess that
        imports vLLM) and compiled graphs, keyed by vLLM itself on the model code, the engine
        version and the config, written atomically and re-made where a load fails. One per cache
        dir, as vLLM's own default is one per user, not one per replica: the replicas of a
        service and its later starts reuse what the first start made (measured: a CPU replica's
        start 61 -> 48 s on two cores, benchmarks/replica_start.py)."""
        return self.settings.cache_dir / "vllm"

    def inductor_cache(self) -> Path:
        """torch inductor's cache (`TORCHINDUCTOR_CACHE_DIR`, an engine_env entry still sets
        another): the kernels vLLM compiles outside its model graph, with --enforce-eager too (the
        sampler's, and the rank count of logprobs), and on CPU the precompiled C++ header they
        build on (engine_side/header_cache.py). Inductor's default is a folder of the temp dir,
        the replica's own: every start compiled them again at its first request, and a `grm-service
        replica` left them behind. Inductor keys each entry on its source, the torch version and
        the compiler's flags, and locks what it writes, so one folder serves every replica."""
        return self.settings.cache_dir / "torchinductor"

    def gpu_set(self, index: int) -> tuple[int, ...]:
        return ()

    def common_args(self) -> list[str]:
        s = self.settings
        args = ["--seed", str(s.seed), "--served-model-name", s.model_name, "--dtype", s.dtype]
        if s.max_model_len:
            args += ["--max-model-len", str(s.max_model_len)]
        return args + list(s.engine_args)

    def tensor_parallel_size(self) -> int:
        return self.settings.tensor_parallel_size
