"""Request bodies the gateway validates itself; everything else passes through to the engine."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

_INT64 = 2**63 - 1


class ChatCompletionRequest(BaseModel):
    """OpenAI chat completion; unknown fields are kept and forwarded untouched."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    # Not coerced here (`true` or "7" would be forwarded as 1 or 7 while the client believes it
    # sent them): the checkpoint checks every seed that enters, chat's too, with one 400 message.
    seed: Any = Field(None, description=f"An integer in [0, {_INT64}] (else 400).")
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    stream: bool | None = None


class ClassifyRequest(BaseModel):
    """vLLM's /classify body: any JSON object, forwarded with the served model filled in."""

    model_config = ConfigDict(extra="allow")


class ResponsesRequest(BaseModel):
    """The Responses API's create request; unknown fields are kept and forwarded untouched."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]]
    seed: Any = Field(None, description=f"An integer in [0, {_INT64}] (else 400).")
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    stream: bool | None = None


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that reads its own body and validates it by
    `model` (the hot routes: `HotPath.serve`)."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": schema}}}}
