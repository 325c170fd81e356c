"""Health, readiness, metrics and the service identity."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from grm_service.gateway.edge.deps import gateway
from grm_service.gateway.edge.guards import asker_of
from grm_service.gateway.request.context import ForwardContext
from grm_service.replicas.identity import IdentityReport

router = APIRouter()
GatewayDep = Annotated[ForwardContext, Depends(gateway)]


@router.get("/health")
async def health() -> dict[str, str]:
    """The gateway process is up (replicas may still be starting: see /ready)."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(request: Request, gw: GatewayDep) -> JSONResponse:
    """Open to load balancers (the status code); replica details (addresses, pids, errors)
    only with a valid key when keys are set."""
    if gw.look is not None:  # a worker answers from the keeper's latest, as it routes
        gw.look()
    ok = bool(gw.pool.ready()) and not gw.draining
    status = 200 if ok else 503
    if not asker_of(request.scope).authorized:
        return JSONResponse({"ready": ok}, status_code=status)
    replicas = [
        {"name": r.name, "state": r.state, "url": r.url, "restarts": r.restarts,
         "in_flight": r.gate.inflight, "pid": r.pid, "detail": r.detail}
        for r in gw.pool.replicas
    ]
    return JSONResponse({"ready": ok, "replicas": replicas, "batches_in_flight": gw.batches},
                        status_code=status)


@router.get("/metrics")
async def metrics(gw: GatewayDep) -> Response:
    return Response(gw.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/fingerprint")
async def fingerprint(gw: GatewayDep) -> IdentityReport:
    return gw.identity.report(gw.pool)


@router.get("/v1/audit")
async def audit(gw: GatewayDep) -> dict[str, Any]:
    """Live-audit counts and the most recent violations, each with both fingerprints."""
    report: dict[str, Any] = gw.auditor.report() if gw.auditor else {"fraction": 0.0}
    report["serialized_replicas"] = [r.name for r in gw.pool.replicas if r.serialized]
    return report


@router.get("/v1/capabilities")
async def capabilities(gw: GatewayDep) -> dict[str, Any]:
    """What the engine guarantees, and what a client paces itself to: `slots` (requests the
    ready replicas serve at once), `score_items_admitted` (items of /v1/score batches
    accepted at once; past it 429) and `score_max_tokens` (the cap of a scorer's max_tokens
    where a batch's sampling sets none, or null). Pooling (`/classify`, `/v1/embeddings`: the
    classify and clip scorers): `pooling_invariant` (the engine was measured so),
    `pooling_batched` (the replicas whose pooling canary proved it, the only ones that co-batch
    it) and `pooling_note` (what was measured)."""
    caps = gw.identity.capabilities
    slots = gw.slots()
    batched = sorted(r.name for r in gw.pool.replicas if r.pooling_batched)
    return {"batch_invariant": caps.batch_invariant,
            "sampling_invariant": caps.sampling_invariant, "note": caps.note,
            "pooling_invariant": caps.pooling_invariant, "pooling_batched": batched,
            "pooling_note": caps.pooling_note,
            "serialize": gw.settings.serialize, "routing": gw.settings.routing,
            "slots": slots, "score_items_admitted": gw.backlog.bound(slots),
            "score_max_tokens": gw.identity.score_max_tokens}
