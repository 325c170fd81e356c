"""The choices of the settings that take one of a few words (the `Settings` field types)."""

from __future__ import annotations

from enum import StrEnum


class EngineName(StrEnum):
    AUTO = "auto"
    VLLM = "vllm"
    VLLM_CPU = "vllm-cpu"


class SerializeMode(StrEnum):
    AUTO = "auto"  # serialize exactly where the engine cannot co-batch deterministically
    ON = "on"
    OFF = "off"


class Launcher(StrEnum):
    LOCAL = "local"  # child processes of the gateway
    RAY = "ray"  # one Ray actor per replica on an existing Ray cluster


class WorkerSockets(StrEnum):
    # One listening socket per worker, the port shared (SO_REUSEPORT): the kernel spreads new
    # connections over them by their addresses' hash.
    PER_WORKER = "per-worker"
    # One socket all workers accept on: whichever worker wakes first takes what is queued.
    SHARED = "shared"


class RayPlacement(StrEnum):
    SPREAD = "spread"
    PACK = "pack"


class NondeterminismPolicy(StrEnum):
    FAIL = "fail"
    SERIALIZE = "serialize"


class LedgerBodies(StrEnum):
    ALL = "all"  # every request's canonical body is kept (replayable)
    TAGGED = "tagged"  # bodies only of requests that carry a run tag (x-grm-run)
    NONE = "none"  # digests only: where prompts must not be stored


class RoutingMode(StrEnum):
    RENDEZVOUS = "rendezvous"
    LEAST_LOADED = "least-loaded"
