"""How much freed memory the gateway process keeps for reuse (glibc's malloc), and how often its
cycle collector runs (`settle_collector`).

An image request moves a few buffers of its body's size through the process (the body read,
the image string, the canonical JSON). By default glibc hands freed memory at the top of its
heap back to the kernel once more than about twice the largest recent allocation is free: at
one multi-megabyte image request at a time, that is after every request, and the next one
faults every page in again (measured: ~2,600 page faults and ~9 ms of system CPU per 2.7 MB
request, against ~1 ms with the memory kept; `benchmarks/bench_images.py`). Keeping up to
`keep_bytes` free bounds what an idle gateway holds on to after a burst.
"""

from __future__ import annotations

import ctypes
import gc
import logging

log = logging.getLogger(__name__)

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc's ceiling for the mmap threshold on 64-bit; a larger allocation is mapped on its own
# (and unmapped when freed) whatever the setting.
_MMAP_THRESHOLD_MAX = 32 << 20
# The young generation is collected once this many container objects were allocated and not
# freed. At CPython's 700, with 64 requests in flight, each pass walked the frames of every
# coroutine in flight: ~6-8 us of a chat request's CPU in process, a pass every ~34 requests
# (benchmarks/RESULTS.md). At 5,000: ~0.9 us, a pass of ~2 ms every ~2,000 requests; 10,000
# saves no more and makes a pass take up to 10 ms. The objects of a request die by their
# reference counts, not in a collection.
YOUNG_COLLECTION = 5_000


def keep_freed_memory(keep_bytes: int) -> bool:
    """Keep up to `keep_bytes` of freed heap for reuse; 0 leaves glibc's defaults. False where
    the C library has no `mallopt` (not glibc)."""
    if keep_bytes <= 0:
        return True
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        log.info("no mallopt in this C library: freed memory is kept as it decides")
        return False
    # Setting the trim threshold turns off glibc's adaptive thresholds, so the mmap threshold
    # is set too: allocations below it come from the heap and are reused, not unmapped.
    ok = bool(mallopt(_M_MMAP_THRESHOLD, min(keep_bytes, _MMAP_THRESHOLD_MAX)))
    return bool(mallopt(_M_TRIM_THRESHOLD, keep_bytes)) and ok


def release_freed() -> bool:
    """Hand every freed page of the heap back to the kernel. Called after a burst of large
    bodies, once nothing has been in flight for a tick: glibc alone trims only the top of each
    arena, so freed chunks between live ones are never handed back; and a pad kept at the top
    holds the burst itself when its buffers were the last allocated (measured: 200 MiB still
    resident after 24 x 8 MiB freed and `malloc_trim(256 MiB)`, 0 after `malloc_trim(0)`). The
    next burst faults its buffers in once; in steady traffic there is no quiet tick and the
    trim threshold keeps them. False where the C library has no `malloc_trim`."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is None:
        return False
    trim(ctypes.c_size_t(0))
    return True


def settle_collector() -> None:
    """After start-up: what it built (modules, the app, its schemas: ~80k objects) lives as long
    as the process, so it is kept out of the cycle collector, whose full passes would otherwise
    walk it all every few thousand requests (measured ~5 us per request on the hot path); and
    the young generation is collected less often (`YOUNG_COLLECTION`)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION, middle, old)
