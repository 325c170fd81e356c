"""Freed memory kept for reuse: a multi-megabyte buffer allocated again costs no page faults;
and handed back whole after a burst, wherever in the heap it lies.

Runs in a child interpreter: malloc's settings are process-wide and would outlive the test.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from grm_service.gateway.heap import YOUNG_COLLECTION

CHILD = """
import resource, sys
from grm_service.gateway.heap import keep_freed_memory
assert keep_freed_memory(int(sys.argv[1]))
def request():
    # What one image request does: a few body-sized buffers, alive at once, then freed.
    buffers = [bytes(3 << 20), bytearray(3 << 20), b"x" * (3 << 20)]
    return len(buffers)
request()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    request()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def _faults_per_request(keep_bytes: int) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, str(keep_bytes)], check=True,
                         capture_output=True, text=True, timeout=60)
    return float(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_kept_memory_is_reused_without_page_faults() -> None:
    pages = (9 << 20) // 4096
    assert _faults_per_request(0) > pages / 2  # the default gives it back: faulted in again
    assert _faults_per_request(256 << 20) < 50


TRIM_CHILD = """
import sys
from grm_service.gateway.heap import keep_freed_memory, release_freed
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
assert keep_freed_memory(256 << 20)
idle = rss()
# The burst's buffers are the last allocated: freed, they join the heap's top, which a trim
# with a pad of the kept size would leave resident.
burst = [b"x" * (8 << 20) + b"y" for _ in range(24)]
del burst
assert release_freed()
print(rss() - idle)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_burst_freed_at_the_heaps_top_is_handed_back() -> None:
    out = subprocess.run([sys.executable, "-c", TRIM_CHILD], check=True, capture_output=True,
                         text=True, timeout=60)
    assert int(out.stdout) < 16 << 20  # of 192 MiB freed


COLLECTOR_CHILD = """
import gc, sys
from grm_service.gateway.heap import YOUNG_COLLECTION, settle_collector
if sys.argv[1] == "settled":
    settle_collector()
    assert gc.get_threshold()[0] == YOUNG_COLLECTION and gc.get_freeze_count() > 0
before = gc.get_stats()[0]["collections"]
# What requests in flight hold: containers allocated and still alive.
held = [{"request": i} for i in range(20_000)]
print(gc.get_stats()[0]["collections"] - before)
"""


def _young_collections(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", COLLECTOR_CHILD, mode], check=True,
                         capture_output=True, text=True, timeout=60)
    return int(out.stdout)


def test_the_settled_collector_collects_the_young_generation_less_often() -> None:
    assert _young_collections("default") >= 20  # every ~700 containers held
    assert _young_collections("settled") <= 20_000 // YOUNG_COLLECTION
