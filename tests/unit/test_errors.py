"""The error tree's one mapping to HTTP: every class of `errors.py` answers OpenAI's error object,
its `type` OpenAI's value for the status and its `code` the service's reason, and OpenAI's own
SDK, over real HTTP, raises the error of that status with both read back."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from grm_service import errors
from grm_service.errors import GrmError, error_body, openai_type
from grm_service.gateway.edge.replies import Reply, error_reply

# OpenAI's values, by status (what its API answers and its SDKs are written against).
OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                404: "not_found_error", 405: "invalid_request_error",
                408: "invalid_request_error", 413: "invalid_request_error",
                422: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
                502: "server_error", 503: "server_error"}
# The SDK's exception for each status (an APIStatusError of no subclass for the others).
SDK_ERRORS: dict[int, type[openai.APIStatusError]] = {
    400: openai.BadRequestError, 401: openai.AuthenticationError, 404: openai.NotFoundError,
    422: openai.UnprocessableEntityError, 429: openai.RateLimitError,
    500: openai.InternalServerError, 502: openai.InternalServerError,
    503: openai.InternalServerError}
# A set: the deprecated names are the same classes under a second name.
CLASSES = sorted({c for c in vars(errors).values()
                  if isinstance(c, type) and issubclass(c, GrmError)}, key=lambda c: c.__name__)


def instances() -> list[GrmError]:
    """One of each class; an engine's refusal with each status it passes on."""
    made: list[GrmError] = []
    for cls in CLASSES:
        if cls is errors.ReplicaRejected:
            made += [cls("engine: too long", status) for status in (400, 404, 413, 422)]
        elif cls is errors.InvalidFields:
            made.append(cls("messages: List should have at least 1 item", "messages"))
        else:
            made.append(cls(f"a {cls.__name__}"))
    return made


ERRORS = instances()
REPLIES: list[Reply] = [error_reply(err) for err in ERRORS]


def test_every_class_is_in_the_drawn_tree_and_the_table() -> None:
    doc = errors.__doc__ or ""
    assert [c.__name__ for c in CLASSES if c.__name__ not in doc] == []
    assert {err.http_status for err in ERRORS} <= OPENAI_TYPES.keys()


@pytest.mark.parametrize("err", ERRORS, ids=lambda e: f"{type(e).__name__}-{e.http_status}")
def test_the_type_is_openais_for_the_status_and_the_code_the_reason(err: GrmError) -> None:
    status, _, body = error_reply(err)
    error = json.loads(body)["error"]
    assert status == err.http_status
    assert error == {"message": err.message, "type": OPENAI_TYPES[status],
                     "param": err.param, "code": type(err).code}
    assert error_body(err) == {"error": error}
    assert error["code"] not in set(OPENAI_TYPES.values())


def test_a_replica_is_a_replica_and_the_old_names_are_the_same_classes() -> None:
    """One name per concept: no code, class or drawn line says "backend"."""
    assert [c.code for c in CLASSES if "backend" in c.code + c.__name__] == []
    assert "backend" not in (errors.__doc__ or "").lower()
    assert errors.ReplicaFailed("x").code == "replica_failed"
    assert errors.BackendFailed is errors.ReplicaFailed
    assert errors.BackendRejected is errors.ReplicaRejected


def test_the_unknown_model_is_a_404_and_the_type_follows_the_status_alone() -> None:
    assert errors.UnknownModel("m").http_status == 404
    assert [openai_type(s) for s in (400, 403, 409, 418, 501, 599)] == [
        "invalid_request_error", "permission_error", "invalid_request_error",
        "invalid_request_error", "server_error", "server_error"]


def test_retry_after_and_the_edges_headers_go_with_the_error() -> None:
    _, headers, _ = error_reply(errors.Overloaded("full", retry_after=2.4),
                                {"www-authenticate": "Bearer"})
    assert headers[:2] == [(b"retry-after", b"2"), (b"www-authenticate", b"Bearer")]


class _Replies(BaseHTTPRequestHandler):
    """Answers `POST /<n>` with the n-th error's reply, as the gateway's renderer makes it."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        status, headers, body = REPLIES[int(self.path.strip("/"))]
        self.send_response(status)
        for name, value in headers:
            self.send_header(name.decode("latin-1"), value.decode("latin-1"))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def replies_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Replies)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_openais_sdk_raises_the_error_of_the_status_with_type_and_code(replies_url: str) -> None:
    client = openai.OpenAI(base_url=replies_url, api_key="k", max_retries=0)
    for index, err in enumerate(ERRORS):
        with pytest.raises(openai.APIStatusError) as caught:
            client.post(f"/{index}", body={}, cast_to=object)
        raised = caught.value
        assert type(raised) is SDK_ERRORS.get(err.http_status, openai.APIStatusError), err
        assert raised.status_code == err.http_status
        assert (raised.type, raised.code, raised.param) == (
            OPENAI_TYPES[err.http_status], type(err).code, err.param)
        assert isinstance(raised.body, dict) and raised.body["message"] == err.message
