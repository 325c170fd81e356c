"""The engines' own metrics (vLLM's `vllm:*`: queue, KV cache, tokens) through the gateway.

`GET /metrics/targets` is Prometheus HTTP service discovery: one target per replica, pointing
back at this gateway's `GET /metrics/engine?replica=NAME`, which relays that replica's /metrics.
One scrape config thus reaches every replica the gateway knows, whether it launched them on
loopback inside its own container (unreachable from Prometheus directly), attached them by URL,
or placed them with Ray; replicas added or restarted on new ports are followed at the next
discovery refresh.
"""

from __future__ import annotations

from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Depends, Request, Response

from grm_service.errors import UnknownReplica
from grm_service.gateway.edge.deps import gateway
from grm_service.gateway.request.context import ForwardContext
from grm_service.replicas.credentials import replica_headers

ENGINE_METRICS = "/metrics/engine"
TARGETS = "/metrics/targets"
_FETCH_TIMEOUT_S = 10.0  # below Prometheus' default scrape timeout

router = APIRouter()
GatewayDep = Annotated[ForwardContext, Depends(gateway)]


@router.get(TARGETS)
async def targets(request: Request, gw: GatewayDep) -> list[dict[str, Any]]:
    """Every replica, as seen from the scraper: the address it reached this gateway by (its
    Host header), the relay path, and the replica's name as a label and a parameter."""
    here = request.headers.get("host") or f"{gw.settings.host}:{gw.settings.port}"
    return [{"targets": [here],
             "labels": {"replica": r.name, "__metrics_path__": ENGINE_METRICS,
                        "__param_replica": r.name}}
            for r in gw.pool.replicas]


@router.get(ENGINE_METRICS)
async def engine_metrics(replica: str, gw: GatewayDep) -> Response:
    """The replica's /metrics as it answered; 503 while it does not answer, so that the
    target's `up` is 0 exactly while the engine is out."""
    found = gw.pool.by_name(replica)
    if found is None:
        known = ", ".join(r.name for r in gw.pool.replicas)
        raise UnknownReplica(f"replica {replica[:40]!r} is not one of this gateway's: {known}")
    if not found.url:
        return Response(f"replica {replica} has no address yet ({found.state})\n",
                        status_code=503, media_type="text/plain")
    try:
        async with httpx.AsyncClient(timeout=_FETCH_TIMEOUT_S,
                                     headers=replica_headers(gw.settings)) as client:
            answer = await client.get(found.url + "/metrics")
    except httpx.HTTPError as err:
        return Response(f"replica {replica} at {found.url}: {type(err).__name__}: {err}\n",
                        status_code=503, media_type="text/plain")
    if answer.status_code != 200:
        return Response(f"replica {replica} /metrics answered {answer.status_code}\n",
                        status_code=503, media_type="text/plain")
    kind = answer.headers.get("content-type", "text/plain; version=0.0.4")
    return Response(answer.content, media_type=kind)
