"""Refusals as clients read them: validation errors shaped like OpenAI's, naming the field."""

from __future__ import annotations

import json

from grm_service.gateway.edge.replies import validation_reply


def test_validation_error_names_the_field_like_openai() -> None:
    status, headers, body = validation_reply([
        {"type": "missing", "loc": ("body", "items", 0, "id"), "msg": "Field required"},
        {"type": "string_type", "loc": ("body", "scorer"), "msg": "Input should be a string"},
    ])

    error = json.loads(body)["error"]
    assert status == 422 and (b"content-type", b"application/json") in headers

    assert error == {
        "message": "items.0.id: Field required; scorer: Input should be a string",
        "type": "invalid_request_error", "param": "items.0.id", "code": "invalid_fields",
    }
