"""The exception tree of grm-service and its one mapping to HTTP.

    GrmError                      500  internal (a bug, never user input)
    ├── InvalidRequest            400  the request is well-formed JSON but asks for something wrong
    │   ├── UnknownModel          400  `model` names a model this service does not serve
    │   ├── StreamingUnsupported  400  `stream=true`: a fingerprint needs the whole response
    │   ├── UnknownScorer         400  `scorer` names no registered scorer
    │   ├── UnknownReplica        400  `x-grm-pin-replica` names no replica of this service
    │   ├── FieldNotAllowed       400  a field or content part the checkpoint does not forward
    │   ├── OverLimit             400  a value above an operator cap (n, max_tokens, nesting)
    │   ├── ImageError            400  an inline image that is broken, too big, or a remote URL
    │   └── BadTag                400  an `x-grm-run` / `x-grm-step` header that is not usable
    ├── TooLarge                  413  more items or JSON values than the operator allows
    ├── Overloaded                429  every replica is at its in-flight limit and the queue is full
    ├── ServiceUnavailable        503  no healthy replica, or the service is draining
    ├── BackendFailed             502  every attempt at a replica failed (connection, 5xx, timeout)
    │   └── ResponseTooLarge      502  a replica's answer is over GRM_MAX_RESPONSE_BYTES
    ├── BackendRejected           4xx  the engine refused the request; its status and message kept
    ├── NotFound                  404  a ledger record that does not exist (or is another key's)
    ├── LedgerUnavailable         503  the ledger's store failed (full disk, database gone):
    │   │                              counted and logged, never an answer's failure (only
    │   │                              a `GET /v1/ledger/...` read's)
    │   └── LedgerNotMoved        503  a ledger file of an earlier layout, read before a
    │                                  gateway (or `ledger upgrade`) moved it
    └── ConfigError               ---  invalid configuration found at start-up (CLI exits)
        ├── ModelNotFound         ---  a model no engine could load: a missing folder, a hub
        │                              id neither cached nor reachable (model_source.py)
        └── WorkDirBusy           ---  a work dir another live service holds (work_dir.py)

Lower-library errors (httpx, json) are translated into this tree where they occur; handlers map the
tree to responses through `http_status` alone.
"""

from __future__ import annotations


class GrmError(Exception):
    """Base of every error the service raises on purpose."""

    http_status = 500
    code = "internal_error"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class InvalidRequest(GrmError):
    http_status = 400
    code = "invalid_request"


class UnknownModel(InvalidRequest):
    code = "unknown_model"


class StreamingUnsupported(InvalidRequest):
    code = "streaming_unsupported"


class UnknownScorer(InvalidRequest):
    code = "unknown_scorer"


class UnknownReplica(InvalidRequest):
    code = "unknown_replica"


class FieldNotAllowed(InvalidRequest):
    code = "field_not_allowed"


class OverLimit(InvalidRequest):
    code = "over_limit"


class ImageError(InvalidRequest):
    code = "invalid_image"


class BadTag(InvalidRequest):
    code = "bad_tag"


class TooLarge(GrmError):
    http_status = 413
    code = "too_large"


class Overloaded(GrmError):
    http_status = 429
    code = "overloaded"


class ServiceUnavailable(GrmError):
    http_status = 503
    code = "service_unavailable"


class BackendFailed(GrmError):
    http_status = 502
    code = "backend_failed"


class ResponseTooLarge(BackendFailed):
    """Not retried: the same request gets the same answer, as large, from any replica."""

    code = "response_too_large"


class BackendRejected(GrmError):
    """The engine answered 4xx: the request is wrong for this model (too long, bad image...)."""

    code = "rejected_by_engine"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.http_status = status


class NotFound(GrmError):
    http_status = 404
    code = "not_found"


class LedgerUnavailable(GrmError):
    http_status = 503
    code = "ledger_unavailable"


class LedgerNotMoved(LedgerUnavailable):
    pass


class ConfigError(GrmError):
    code = "config_error"


class ModelNotFound(ConfigError):
    code = "model_not_found"


class WorkDirBusy(ConfigError):
    code = "work_dir_busy"


def error_body(err: GrmError) -> dict[str, object]:
    """The OpenAI-style error object every client of this field already parses."""
    return {"error": {"message": err.message, "type": err.code, "code": err.http_status}}
