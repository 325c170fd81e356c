"""Refusals as clients read them: validation errors shaped like OpenAI's, naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grm_service.config import Settings
from grm_service.errors import ConfigError
from grm_service.gateway.app import _scales
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


def test_the_served_dual_encoders_scales_are_read_once_at_start(tmp_path: Path) -> None:
    attached = Settings(backend_urls=["http://127.0.0.1:9"])
    assert _scales(attached) is None, "no model: the clip scorer says so per item"
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["CLIPModel"]}))
    with pytest.raises(ConfigError, match="convert it to safetensors"):
        _scales(Settings(model=str(tmp_path)))
