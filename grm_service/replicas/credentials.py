"""The gateway's credentials at its replicas' door.

A vLLM server started with `--api-key` (or `VLLM_API_KEY`) refuses its OpenAI routes (`/v1/...`)
with a 401 to anyone without `Authorization: Bearer <key>`; its `/health`, `/version` and
`/metrics` stay open. Replicas reached over a network are often started so. With
`GRM_REPLICA_API_KEY` set, the gateway sends that key on every request to a replica: in the hot
path's request head (`upstream.py`, its lines made once per replica from `replica_headers`),
from the client of the health probes, identity reads and canaries (`probe_client`), and from the
engine metrics relay. The replicas it launches start with it as `VLLM_API_KEY`
(`engines/base.py`), so their routes refuse whoever does not hold it.

The key is never a numerics input (not in the env digest) and never logged. Without it, a keyed
replica's 401 is a fault of that replica's door, not of the client's request: the gateway fails
over and names it (`exchange.py`).
"""

from __future__ import annotations

import httpx

from grm_service.config import Settings


def replica_headers(settings: Settings) -> dict[str, str]:
    """The headers every request to a replica carries (none without a key)."""
    key = settings.replica_api_key
    return {"Authorization": f"Bearer {key}"} if key else {}


def probe_client(settings: Settings) -> httpx.AsyncClient:
    """The client of the health probes, identity reads and canaries: off the hot path."""
    return httpx.AsyncClient(headers=replica_headers(settings))
