"""Refusals as clients read them: OpenAI-shaped validation errors, keys in headers or URLs."""

from __future__ import annotations

import base64

import pytest
from fastapi.exceptions import RequestValidationError

from grm_service.api.app import validation_body
from grm_service.api.guards import presented_key


def test_validation_error_names_the_field_like_openai() -> None:
    exc = RequestValidationError([
        {"type": "missing", "loc": ("body", "items", 0, "id"), "msg": "Field required"},
        {"type": "string_type", "loc": ("body", "scorer"), "msg": "Input should be a string"},
    ])

    error = validation_body(exc)["error"]

    assert error == {
        "message": "items.0.id: Field required; scorer: Input should be a string",
        "type": "invalid_request_error", "param": "items.0.id", "code": 422,
    }


def basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


@pytest.mark.parametrize(("header", "key"), [
    (b"Bearer k1", b"k1"),
    (b"bearer  k1 ", b"k1"),
    (basic("grm", "k1"), b"k1"),  # http://grm:k1@host/ as aiohttp and httpx send it
    (basic("", "k:with:colons"), b"k:with:colons"),
    (b"Basic not-base64!", None),
    (b"Token k1", None),
    (b"", None),
])
def test_presented_key(header: bytes, key: bytes | None) -> None:
    assert presented_key(header) == key
