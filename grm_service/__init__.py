"""grm-service: a deterministic scoring service for reward models.

The public surface, declared the way httpx declares its own: the names of `__all__` below (the
client, its types and errors, the settings model, the service's errors), the module
`grm_service.client` and the trainer adapters `grm_service.integrations.*`. Every other module is
private: it may change in any release without notice (docs/public-api.md). The client
distribution ships this file too: there, the server's names (`Settings`, the service's errors)
say that they come with the server's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grm_service import client, integrations
    from grm_service.client import (
        AsyncGrmClient,
        GrmClient,
        GrmClientError,
        RequestRejected,
        RetriesExhausted,
        RetryPolicy,
    )
    from grm_service.config import Settings
    from grm_service.errors import (
        BadHeader,
        BadTag,
        ConfigError,
        EdgeFull,
        FieldNotAllowed,
        GrmError,
        ImageError,
        InvalidFields,
        InvalidJson,
        InvalidRequest,
        LedgerNotMoved,
        LedgerUnavailable,
        MethodNotAllowed,
        ModelNotFound,
        NoReward,
        NotFound,
        OverLimit,
        Overloaded,
        ReplicaFailed,
        ReplicaRejected,
        RequestTimeout,
        ResponseTooLarge,
        ServiceUnavailable,
        StreamingUnsupported,
        TooLarge,
        TooManyGroups,
        Unauthorized,
        UnknownModel,
        UnknownReplica,
        UnknownRoute,
        UnknownScorer,
        WorkDirBusy,
    )
    from grm_service.wire import ItemResult, ScoreItem, ScoreResponse

__version__ = "0.1.0"

_CLIENT = ("AsyncGrmClient", "GrmClient", "GrmClientError", "RequestRejected",
           "RetriesExhausted", "RetryPolicy")
_WIRE = ("ItemResult", "ScoreItem", "ScoreResponse")
_ERRORS = (
    "BadHeader", "BadTag", "ConfigError", "EdgeFull", "FieldNotAllowed", "GrmError", "ImageError",
    "InvalidFields", "InvalidJson", "InvalidRequest", "LedgerNotMoved", "LedgerUnavailable",
    "MethodNotAllowed", "ModelNotFound", "NoReward", "NotFound", "OverLimit", "Overloaded",
    "ReplicaFailed", "ReplicaRejected", "RequestTimeout", "ResponseTooLarge", "ServiceUnavailable",
    "StreamingUnsupported", "TooLarge", "TooManyGroups", "Unauthorized", "UnknownModel",
    "UnknownReplica", "UnknownRoute", "UnknownScorer", "WorkDirBusy",
)
# Each public name's module, imported on first use: importing the package loads neither the
# client's httpx nor the server's settings, so a server module never pulls in the client.
_HOME = {
    **dict.fromkeys(_CLIENT, "grm_service.client"),
    **dict.fromkeys(_WIRE, "grm_service.wire"),
    **dict.fromkeys(_ERRORS, "grm_service.errors"),
    "Settings": "grm_service.config",
}
_MODULES = ("client", "integrations")

__all__ = [
    "AsyncGrmClient", "BadHeader", "BadTag", "ConfigError", "EdgeFull", "FieldNotAllowed",
    "GrmClient", "GrmClientError", "GrmError", "ImageError", "InvalidFields", "InvalidJson",
    "InvalidRequest", "ItemResult", "LedgerNotMoved", "LedgerUnavailable", "MethodNotAllowed",
    "ModelNotFound", "NoReward", "NotFound", "OverLimit", "Overloaded", "ReplicaFailed",
    "ReplicaRejected", "RequestRejected", "RequestTimeout", "ResponseTooLarge",
    "RetriesExhausted", "RetryPolicy", "ScoreItem", "ScoreResponse", "ServiceUnavailable",
    "Settings", "StreamingUnsupported", "TooLarge", "TooManyGroups", "Unauthorized",
    "UnknownModel", "UnknownReplica", "UnknownRoute", "UnknownScorer", "WorkDirBusy",
    "__version__", "client", "integrations",
]


def __getattr__(name: str) -> Any:
    module = f"grm_service.{name}" if name in _MODULES else _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'grm_service' has no attribute {name!r}")
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module:
            raise
        # The client distribution (client/pyproject.toml) ships this file without the server.
        raise ModuleNotFoundError(
            f"grm_service.{name} comes with the server distribution (pip install grm-service); "
            "this environment has the client's (grm-service-client)", name=module) from None
    return loaded if name in _MODULES else getattr(loaded, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
