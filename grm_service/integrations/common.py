"""What the adapters share: where the service is and its key, text out of chat messages, images
to data URLs (references out of ground truths: truths.py)."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grm_service.client import AsyncGrmClient, GrmClient, RetryPolicy
from grm_service.mime import encode_bytes
from grm_service.wire import ItemResult

URL_ENV = "GRM_SERVICE_URL"
KEY_ENV = "GRM_API_KEY"
# The run tag of every adapter's calls on the service's ledger (x-grm-run), where none is given.
RUN_ENV = "GRM_RUN"
# One /v1/score batch may take this long, and is tried 1 + RETRIES times while the service is
# busy or unreachable: a stuck batch holds a trainer's step for minutes, not hours.
TIMEOUT_S = 300.0
RETRIES = 2


class ScoringError(RuntimeError):
    """An item could not be scored and the adapter was not told what reward to use instead."""


def service_url(url: str | None) -> str:
    found = url or os.environ.get(URL_ENV)
    if not found:
        raise ScoringError(f"no grm-service URL: pass url=... or set {URL_ENV}")
    return found


@dataclass(frozen=True)
class Endpoint:
    """A service and how to reach it: URL, API key (bearer), extra headers, batching, and the
    run tag its answers are kept under on the service's ledger."""

    url: str
    api_key: str | None = field(default=None, repr=False)  # never in a printed config
    headers: tuple[tuple[str, str], ...] = field(default=())
    batch_size: int = 32
    concurrency: int = 4
    timeout: float = TIMEOUT_S
    retries: int = RETRIES
    run: str | None = None

    def _retry(self) -> RetryPolicy:
        # A trainer's step waits on its rewards: a busy answer is a try like any other here.
        return RetryPolicy(attempts=self.retries + 1, patience_s=0.0)

    def client(self) -> GrmClient:
        return GrmClient(self.url, api_key=self.api_key, headers=dict(self.headers),
                         batch_size=self.batch_size, concurrency=self.concurrency,
                         timeout=self.timeout, retry=self._retry(), run=self.run)

    def async_client(self) -> AsyncGrmClient:
        return AsyncGrmClient(self.url, api_key=self.api_key, headers=dict(self.headers),
                              batch_size=self.batch_size, concurrency=self.concurrency,
                              timeout=self.timeout, retry=self._retry(), run=self.run)


def endpoint(
    url: str | None = None, api_key: str | None = None,
    headers: Mapping[str, str] | None = None, batch_size: int = 32, concurrency: int = 4,
    timeout: float = TIMEOUT_S, retries: int = RETRIES, api_key_env: str = KEY_ENV,
    run: str | None = None,
) -> Endpoint:
    """The endpoint from arguments, falling back to GRM_SERVICE_URL, the key's variable
    (GRM_API_KEY unless `api_key_env` names another) and GRM_RUN for the run tag."""
    if not timeout > 0:
        raise ScoringError(f"timeout must be a positive number of seconds, not {timeout!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ScoringError(f"retries must be a whole number >= 0, not {retries!r}")
    return Endpoint(service_url(url), api_key or os.environ.get(api_key_env) or None,
                    tuple(sorted((headers or {}).items())), batch_size, concurrency,
                    float(timeout), retries, run or os.environ.get(RUN_ENV) or None)


def step_of(hooks: Mapping[str, Any]) -> int | None:
    """The trainer's step where it hands one to reward functions (TRL's `trainer_state`)."""
    step = getattr(hooks.get("trainer_state"), "global_step", None)
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def no_key_in_config(api_key: str | None, trainer: str) -> None:
    """A key given in a trainer's config is printed at start-up and logged with the config
    (verl prints `reward_kwargs` and sends them to W&B): refuse it, name the way that is not."""
    if api_key is not None:
        raise ScoringError(f"api_key in {trainer}'s reward_kwargs is printed and logged with the "
                           f"config: set {KEY_ENV} in the workers' environment instead (or name "
                           "another variable with api_key_env=...)")


def text_of(value: Any) -> str:
    """Plain text of a string, a message, or a conversation (its last message)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return text_of(value.get("content"))
    if isinstance(value, list) and value and isinstance(value[0], dict) and "role" in value[0]:
        return text_of(value[-1])
    if isinstance(value, list):  # content parts: keep the text ones
        return "".join(p.get("text", "") for p in value if isinstance(p, dict))
    return str(value)


def image_of(value: Any) -> str | list[str] | None:
    """A data URL (or a list for frames) from a string, raw bytes or a PIL image."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return encode_bytes(value)
    if isinstance(value, list | tuple):
        frames = [image_of(v) for v in value]
        flat = [f for f in frames if isinstance(f, str)]
        return flat[0] if len(flat) == 1 else flat or None
    if hasattr(value, "save"):  # a PIL image, as TRL passes an `image` column
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return encode_bytes(buffer.getvalue())
    raise ScoringError(f"cannot use {type(value).__name__} as an image")


def reward_or(result: ItemResult, error_score: float | None) -> float:
    """The score, or `error_score` for an error item; without one, an error item raises."""
    if result.status == "ok" and result.score is not None:
        return result.score
    if error_score is None:
        raise ScoringError(f"item {result.id} failed: {result.error} (set verl's error_score= "
                           "to use a fixed reward for failed items instead)")
    return error_score
