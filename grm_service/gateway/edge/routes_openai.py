"""OpenAI-compatible routes."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from grm_service.gateway.edge.deps import gateway, hot_door, origin, pinned_replica
from grm_service.gateway.edge.hotpath import CHAT
from grm_service.gateway.edge.replies import ReplyResponse, answer_reply
from grm_service.gateway.edge.schemas import ChatCompletionRequest, ResponsesRequest, body_schema
from grm_service.gateway.request.checkpoint import RESPONSES_PATH
from grm_service.gateway.request.context import ForwardContext
from grm_service.gateway.request.proxy import RESPONSES_TOKENS, forward, prepare
from grm_service.ledger.records import Origin

router = APIRouter()

GatewayDep = Annotated[ForwardContext, Depends(gateway)]
PinDep = Annotated[str | None, Depends(pinned_replica)]
OriginDep = Annotated[Origin, Depends(origin)]


@router.post(CHAT, openapi_extra=body_schema(ChatCompletionRequest))
async def chat_completions(request: Request) -> Response:
    """OpenAI's chat completion, answered by the hot path's one door (`HotPath.serve`)."""
    return await hot_door(request, CHAT)


@router.post("/v1/responses")
async def responses(req: ResponsesRequest, gw: GatewayDep, pin: PinDep,
                    asker: OriginDep) -> Response:
    """The engine's Responses API (NeMo Gym's model servers speak it), seeded, bounded,
    routed, recorded and fingerprinted like chat; its stored state is refused
    (`checkpoint.RESPONSES_DENIED`)."""
    body = prepare(req.model_dump(exclude_unset=True, mode="json"), gw.request_settings,
                   RESPONSES_TOKENS)
    forwarded = await forward(gw, RESPONSES_PATH, body, pin, origin=asker)
    return ReplyResponse(answer_reply(forwarded))


@router.get("/v1/models")
async def models(gw: GatewayDep) -> dict[str, Any]:
    card = {"id": gw.settings.model_name, "object": "model", "owned_by": "grm-service",
            "root": gw.settings.model or gw.settings.model_name}
    return {"object": "list", "data": [card]}
