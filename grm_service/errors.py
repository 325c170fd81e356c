"""The exception tree of grm-service and its one mapping to HTTP.

    GrmError                      500  internal (a bug, never user input)
    ├── InvalidRequest            400  the request cannot be served as sent
    │   ├── InvalidJson           400  the body is not JSON (line, column, what was expected)
    │   ├── StreamingUnsupported  400  `stream=true`: a fingerprint needs the whole response
    │   ├── UnknownScorer         400  `scorer` names no registered scorer
    │   ├── UnknownReplica        400  `x-grm-pin-replica` names no replica of this service
    │   ├── FieldNotAllowed       400  a field or content part the checkpoint does not forward
    │   ├── OverLimit             400  a value above an operator cap (n, max_tokens, nesting)
    │   ├── ImageError            400  an inline image that is broken, too big, or a remote URL
    │   ├── BadHeader             400  a singleton header sent twice, an upgrade request
    │   ├── BadTag                400  an `x-grm-run` / `x-grm-step` header that is not usable
    │   └── InvalidFields         422  the body or query does not fit the route's schema
    ├── Unauthorized              401  no API key, or not one of this service's
    ├── NotFound                  404  a ledger record that does not exist (or is another key's)
    │   ├── UnknownModel          404  `model` names a model this service does not serve
    │   └── UnknownRoute          404  no route at this path
    ├── MethodNotAllowed          405  the route exists, not for this method
    ├── RequestTimeout            408  the request's headers or body did not arrive in time
    ├── TooLarge                  413  more items, bytes or JSON values than the operator allows
    ├── Overloaded                429  every replica is at its in-flight limit and the queue is full
    │   └── TooManyGroups         429  a new group while GRM_GROUP_MAX_OPEN groups are held open
    ├── ServiceUnavailable        503  no healthy replica, or the service is draining
    │   └── EdgeFull              503  the edge's bounds: open connections, request bytes in flight
    ├── ReplicaFailed             502  every attempt at a replica failed (connection, 5xx, timeout)
    │   ├── ResponseTooLarge      502  a replica's answer is over GRM_MAX_RESPONSE_BYTES
    │   └── NoReward              502  `/verify`: the scorer gave a rollout no reward (its reason)
    ├── ReplicaRejected           4xx  the engine refused the request; its status and message kept
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
tree to responses through `error_body` alone. An answer is OpenAI's error object: `type` is
OpenAI's value for the status (`openai_type`), which its SDKs and every client of this field
read, and `code` is this service's own reason (the class's `code`).
"""

from __future__ import annotations


class GrmError(Exception):
    """Base of every error the service raises on purpose. `param`: the request's part at
    fault (OpenAI's `param`), where one is."""

    http_status = 500
    code = "internal_error"
    param: str | None = None

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class InvalidRequest(GrmError):
    http_status = 400
    code = "invalid_request"


class InvalidJson(InvalidRequest):
    code = "invalid_json"


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


class BadHeader(InvalidRequest):
    code = "bad_header"


class BadTag(InvalidRequest):
    code = "bad_tag"


class InvalidFields(InvalidRequest):
    """pydantic's verdict on a body or a query, every problem in `message`, the first one's
    place in `param`."""

    http_status = 422
    code = "invalid_fields"

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


class Unauthorized(GrmError):
    http_status = 401
    code = "invalid_api_key"


class NotFound(GrmError):
    http_status = 404
    code = "not_found"


class UnknownModel(NotFound):
    code = "unknown_model"


class UnknownRoute(NotFound):
    code = "unknown_route"


class MethodNotAllowed(GrmError):
    http_status = 405
    code = "method_not_allowed"


class RequestTimeout(GrmError):
    http_status = 408
    code = "request_timeout"


class TooLarge(GrmError):
    http_status = 413
    code = "too_large"


class Overloaded(GrmError):
    http_status = 429
    code = "overloaded"


class TooManyGroups(Overloaded):
    """Held groups live in a file, not in memory, but each one is a set of waiting requests:
    their number is bounded (scoring/groups/held.py)."""

    code = "too_many_groups"


class ServiceUnavailable(GrmError):
    http_status = 503
    code = "service_unavailable"


class EdgeFull(ServiceUnavailable):
    code = "edge_full"


class ReplicaFailed(GrmError):
    http_status = 502
    code = "replica_failed"


class ResponseTooLarge(ReplicaFailed):
    """Not retried: the same request gets the same answer, as large, from any replica."""

    code = "response_too_large"


class NoReward(ReplicaFailed):
    """A Gym rollout the scorer could not score: an error, never a reward of 0."""

    code = "no_reward"


class ReplicaRejected(GrmError):
    """The engine answered 4xx: the request is wrong for this model (too long, bad image...)."""

    code = "rejected_by_engine"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.http_status = status


# The names of an earlier release, for one release more: the same classes.
BackendFailed = ReplicaFailed
BackendRejected = ReplicaRejected


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


# OpenAI's error types by status; any other 4xx is the request's fault, any 5xx the server's.
_OPENAI_TYPES = {401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 429: "rate_limit_error"}


def openai_type(status: int) -> str:
    """OpenAI's `type` for an error answered with `status`."""
    if status >= 500:
        return "server_error"
    return _OPENAI_TYPES.get(status, "invalid_request_error")


def error_body(err: GrmError) -> dict[str, object]:
    """OpenAI's error object, which every client of this field already parses: its `type`
    by status, this service's reason in `code`."""
    return {"error": {"message": err.message, "type": openai_type(err.http_status),
                      "param": err.param, "code": err.code}}
