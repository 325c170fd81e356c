"""Refusals as clients read them: validation errors shaped like OpenAI's, naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.requests import Request

from grm_service.config import Settings
from grm_service.errors import ConfigError
from grm_service.gateway.app import _scales, create_app
from grm_service.gateway.edge import deps
from grm_service.gateway.edge.replies import validation_reply
from grm_service.gateway.service import Service


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


async def test_the_lifespan_opens_the_held_groups_in_the_work_dir_and_closes_them(
        tmp_path: Path) -> None:
    service = Service(Settings(replica_urls=["http://127.0.0.1:9"], work_dir=tmp_path,
                               ledger=False))
    app = create_app(service).app
    async with app.router.lifespan_context(app):
        request = Request({"type": "http", "app": app})
        held = await deps.held_groups(request)
        assert held is service.held
        assert await held.open_groups() == 0
        assert (tmp_path / "groups.sqlite").is_file()
    with pytest.raises(RuntimeError):  # its thread is gone: closed with the process's stop
        await held.open_groups()


def test_the_served_dual_encoders_scales_are_read_once_at_start(tmp_path: Path) -> None:
    attached = Settings(replica_urls=["http://127.0.0.1:9"])
    assert _scales(attached) is None, "no model: the clip scorer says so per item"
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["CLIPModel"]}))
    with pytest.raises(ConfigError, match="convert it to safetensors"):
        _scales(Settings(model=str(tmp_path)))
