"""Refusals as clients read them: validation errors shaped like OpenAI's, naming the field."""

from __future__ import annotations

from fastapi.exceptions import RequestValidationError

from grm_service.gateway.app import validation_body


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
