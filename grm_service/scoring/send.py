"""How scorers reach the replicas: `proxy.prepare` + `proxy.forward`, one call per request."""

from __future__ import annotations

from typing import Any

from grm_service.errors import UnknownModel
from grm_service.gateway.request.proxy import Gateway, forward, prepare
from grm_service.ledger.records import Origin
from grm_service.scoring.context import CHAT_PATH, Reply, Send


def pooling_body(body: dict[str, Any], model: str) -> dict[str, Any]:
    """Pooling requests take no seed or max_tokens (nothing is sampled): only the model."""
    given = body.get("model") or model
    if given != model:
        raise UnknownModel(f"model {given!r} is not served here; use {model!r}")
    return {**body, "model": given}


def make_send(gw: Gateway, origin: Origin | None = None) -> Send:
    """`origin`: the batch's asker, so that each item's answer is on the ledger. The batch
    was admitted (`Gateway.batch`): a drain begun since does not refuse its items."""

    async def send(path: str, body: dict[str, Any]) -> Reply:
        if path == CHAT_PATH:
            prepared = prepare(body, gw.path_settings)
        else:
            prepared = pooling_body(body, gw.path_settings.model_name)
        forwarded = await forward(gw, path, prepared, origin=origin, admitted=True)
        return forwarded.payload, forwarded.fingerprint

    return send
