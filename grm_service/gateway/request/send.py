"""How scorers reach the replicas: `proxy.prepare` + `proxy.forward`, one call per request.

The scorers see only `scoring.context.Send`; the edge builds one here (`make_send`) per batch."""

from __future__ import annotations

from typing import Any

from grm_service.errors import UnknownModel
from grm_service.gateway.request.context import ForwardContext
from grm_service.gateway.request.proxy import forward, prepare
from grm_service.ledger.records import Origin
from grm_service.scoring.context import CHAT_PATH, Reply, Send


def pooling_body(body: dict[str, Any], model: str) -> dict[str, Any]:
    """Pooling requests take no max_tokens (nothing is sampled): only the model. Their seed,
    the fingerprint's, is `forward`'s to decide, as every path's."""
    given = body.get("model") or model
    if given != model:
        raise UnknownModel(f"model {given!r} is not served here; use {model!r}")
    return {**body, "model": given}


def capped(body: dict[str, Any], max_tokens: int | None) -> dict[str, Any]:
    """A prepared chat body with its max_tokens at most `max_tokens` (None: as it is)."""
    given = body.get("max_tokens")
    if max_tokens is None or given is None or given <= max_tokens:
        return body
    return {**body, "max_tokens": max_tokens}


def make_send(fc: ForwardContext, origin: Origin | None = None,
              max_tokens: int | None = None) -> Send:
    """`origin`: the batch's asker, so that each item's answer is on the ledger. The batch
    was admitted (`ForwardContext.batch`): a drain begun since does not refuse its items.
    `max_tokens`: the cap of the scorer's own max_tokens (`ServiceIdentity.score_max_tokens`),
    None where the batch's sampling sets it; the capped value is in the body the engine gets,
    so in its request digest and on the ledger."""

    async def send(path: str, body: dict[str, Any]) -> Reply:
        if path == CHAT_PATH:
            prepared = capped(prepare(body, fc.request_settings), max_tokens)
        else:
            prepared = pooling_body(body, fc.request_settings.model_name)
        forwarded = await forward(fc, path, prepared, origin=origin, admitted=True)
        return forwarded.payload, forwarded.fingerprint

    return send
