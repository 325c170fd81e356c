"""OpenAI-compatible routes."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from grm_service.gateway.edge.deps import gateway, hot_door
from grm_service.gateway.edge.hotpath import CHAT
from grm_service.gateway.edge.schemas import ChatCompletionRequest, body_schema
from grm_service.gateway.request.proxy import Gateway

router = APIRouter()

GatewayDep = Annotated[Gateway, Depends(gateway)]


@router.post(CHAT, openapi_extra=body_schema(ChatCompletionRequest))
async def chat_completions(request: Request) -> Response:
    """OpenAI's chat completion, answered by the hot path's one door (`HotPath.serve`)."""
    return await hot_door(request, CHAT)


@router.get("/v1/models")
async def models(gw: GatewayDep) -> dict[str, Any]:
    card = {"id": gw.settings.model_name, "object": "model", "owned_by": "grm-service",
            "root": gw.settings.model or gw.settings.model_name}
    return {"object": "list", "data": [card]}
