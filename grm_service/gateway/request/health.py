"""The keeper's health checks over the gateway's own HTTP client (upstream.py).

The keeper asks each ready replica for `/health` every `health_interval_s`. Through httpx a
check cost ~2 ms of CPU (its request and URL objects, the connection pool's bookkeeping, anyio's
streams): a quarter of an idle gateway's CPU (benchmarks/RESULTS.md), which a lightly loaded
gateway shares among few requests. Here a check is one write of a prebuilt GET on a kept-alive
connection, its answer parsed by httptools. The pool is the checks' own, not the request path's:
a replica whose request slots are all taken still answers its checks.
"""

from __future__ import annotations

from grm_service.errors import ResponseTooLarge
from grm_service.gateway.request.upstream import Upstream
from grm_service.replicas.keeper import PROBE_TIMEOUT_S, HealthCheck, Probe

_MAX_ANSWER_BYTES = 64 << 10
_CONNECTIONS = 4  # per replica: checks come one at a time, start-up's and the watch's


def health_pool(ack_timeout_s: float | None = None) -> Upstream:
    """The checks' own keep-alive pool, bounded by the check's timeout."""
    return Upstream(PROBE_TIMEOUT_S, ack_timeout_s, _MAX_ANSWER_BYTES, _CONNECTIONS)


def health_check(pool: Upstream) -> HealthCheck:
    """`GET /health` through `pool`: 200 is OK; nothing listening (or no such host) REFUSED;
    any other answer, a timeout or a connection lost mid-answer BAD."""

    async def check(url: str) -> Probe:
        try:
            status, _ = await pool.get(url, "/health")
        except ConnectionRefusedError:
            return Probe.REFUSED
        except (TimeoutError, ConnectionError, ResponseTooLarge, ValueError):
            return Probe.BAD
        except OSError:  # from the connect: no route to the host, or no such host
            return Probe.REFUSED
        return Probe.OK if status == 200 else Probe.BAD

    return check
