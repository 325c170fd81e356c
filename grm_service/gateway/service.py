"""The composition root of one serving process: built once, before the lifespan, and handed to
every edge (the protocol, the hot path, the middleware, the FastAPI routes).

What lives as long as the process is built here (the settings, the metrics registry and its one
request-metrics path, the connection and body-byte limits of the edge, the held groups, whose
file the lifespan opens). What needs the event loop and the replicas (the keeper, the upstream
pool, the auditor) is built by the lifespan, which hands its `ForwardContext`, the request side, to
`start`; until then the hot path leaves every request to FastAPI, whose routes answer 503.
"""

from __future__ import annotations

from grm_service.config import Settings
from grm_service.gateway.edge.admission import Admission
from grm_service.gateway.edge.limits import EdgeLimits
from grm_service.gateway.edge.middleware import RequestMetrics
from grm_service.gateway.request.context import ForwardContext
from grm_service.gateway.request.refusals import Refusals
from grm_service.gateway.role import WorkerRole
from grm_service.metrics import Metrics
from grm_service.scoring.groups.held import HeldGroups, HoldSettings


class Service:
    def __init__(self, settings: Settings, worker: WorkerRole | None = None) -> None:
        self.settings = settings
        self.worker = worker
        self.metrics = Metrics(worker.metrics_dir if worker else None)
        self.requests = RequestMetrics(self.metrics)
        self.refusals = Refusals(self.metrics.rejected)  # the edge's and the request side's
        self.limits = EdgeLimits(settings, self.refusals)
        self.admission = Admission(settings)  # every edge admits a request through it
        self.gateway: ForwardContext | None = None
        # Groups whose items come in several requests; the lifespan opens and closes its file.
        self.held = HeldGroups(HoldSettings.of(settings))

    def start(self, gateway: ForwardContext) -> None:
        self.gateway = gateway

    def drain(self) -> None:
        """New requests get 503 from here on; in-flight ones finish."""
        if self.gateway is not None:
            self.gateway.draining = True

    @property
    def inflight(self) -> int:
        return self.gateway.inflight if self.gateway is not None else 0
