"""Route digests and replica choice: pure functions of (route digest, healthy replicas).

    route(pool, digest, least_loaded, pin)    # the replicas to try, best first ([]: none ready)

The route digest is crc32 of the canonical request body. Replicas are ranked by rendezvous
(highest random weight) hashing, so when a replica leaves only the digests it owned move, and
when it comes back they return to it. crc32 alone is linear over GF(2), which makes
`crc32(digest + name)` a poor weight; the weight is a 64-bit mix of the digest and a
per-replica salt instead.
"""

from __future__ import annotations

import functools
import operator
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from grm_service.canonical import canonical_json
from grm_service.checksum import crc32
from grm_service.errors import UnknownReplica
from grm_service.replicas.pool import Replica, ReplicaPool

_MASK64 = (1 << 64) - 1
T = TypeVar("T")
_NAME: Callable[[Replica], str] = operator.attrgetter("name")
_INFLIGHT: Callable[[Replica], int] = operator.attrgetter("gate.inflight")


def route_digest(canonical: bytes) -> int:
    return crc32(canonical)


def route_digest_of_parts(parts: Iterable[bytes | memoryview]) -> int:
    """`route_digest` the concatenation of `parts`, without building it."""
    crc = 0
    for part in parts:
        crc = crc32(part, crc)
    return crc


def request_key(body: Mapping[str, Any]) -> int:
    return route_digest(canonical_json(body))


def _mix64(x: int) -> int:
    """splitmix64 finaliser: spreads every input bit over the whole word."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def weight(digest: int, replica: str) -> int:
    return _mix64((digest << 32) ^ _salt(replica))


@functools.lru_cache(maxsize=4096)
def _salt(replica: str) -> int:
    return zlib.crc32(replica.encode())


def rendezvous_order(digest: int, replicas: Sequence[T],
                     name: Callable[[T], str] = str) -> list[T]:
    """All replicas, best first; failover walks this list in order. `name`: a replica's name,
    where `replicas` are not their names."""
    return sorted(replicas, key=lambda r: (weight(digest, name(r)), name(r)), reverse=True)


def pick(digest: int, replicas: Sequence[str]) -> str | None:
    order = rendezvous_order(digest, replicas)
    return order[0] if order else None


def least_loaded_order(
    digest: int, replicas: Sequence[T], inflight: Callable[[T], int],
    name: Callable[[T], str] = str,
) -> list[T]:
    """Fewest in-flight first; equal loads are broken by the rendezvous weight of the digest."""
    return sorted(replicas,
                  key=lambda r: (inflight(r), -weight(digest, name(r)), name(r)))


def route(pool: ReplicaPool, digest: int, least_loaded: bool, pin: str | None = None
          ) -> list[Replica]:
    """The ready replicas in the order a request of route digest `digest` tries them (`pin`:
    the one named, where it is ready); [] where none is."""
    if pin is not None:
        return _pinned(pool, pin)
    now = time.monotonic()
    # With every breaker open, trying a tripped replica beats refusing outright.
    ready = [r for r in pool.replicas if r.ready and not r.breaker_open(now)] or pool.ready()
    if len(ready) < 2:
        return ready
    # The replicas themselves are ranked: no lookups by name, once per request.
    if least_loaded:
        return least_loaded_order(digest, ready, _INFLIGHT, _NAME)
    return rendezvous_order(digest, ready, _NAME)


def looked_again(pool: ReplicaPool, look: Callable[[], object] | None, digest: int,
                 least_loaded: bool, pin: str | None = None) -> list[Replica]:
    """Where `route` found no ready replica: the replica set looked at again (`look`, a
    worker's follower) and routed over; [] where there is still none. A quiet worker's view
    lags the keeper's by up to its follower's interval, where a replica that came back is
    already ready in the other workers' (and in the /ready they answer)."""
    if look is None:
        return []
    look()
    return route(pool, digest, least_loaded, pin)


def states(pool: ReplicaPool) -> str:
    """The replicas' states, for a refusal's message."""
    if not pool.replicas:
        return "none configured"
    shown = ", ".join(f"{r.name} {r.state.value}" for r in pool.replicas[:8])
    return shown + (", ..." if len(pool.replicas) > 8 else "")


def _pinned(pool: ReplicaPool, pin: str) -> list[Replica]:
    replica = pool.by_name(pin)
    if replica is None:
        known = ", ".join(r.name for r in pool.replicas)
        raise UnknownReplica(f"x-grm-pin-replica {pin[:40]!r} names no replica; "
                             f"replicas: {known}")
    return [replica] if replica.ready else []
