"""The request path's metric tally: the same samples as prometheus_client's own updates, in one
process and in multiprocess mode's files, once anything reads them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from grm_service.metrics import Metrics
from grm_service.tally import Tally

# On a bound, between bounds, below the first, past the last (+Inf), zero, and a repeat.
VALUES = [0.005, 0.0051, 0.0001, 700.0, 0.0, 0.3, 0.3, 600]
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 450, 600)


def _samples(registry: CollectorRegistry) -> list[tuple[str, str, float]]:
    return sorted((s.name, repr(sorted(s.labels.items())), s.value)
                  for m in registry.collect() for s in m.samples
                  if not s.name.endswith("_created"))


def _series(registry: CollectorRegistry) -> tuple[Counter, Gauge, Histogram]:
    counter = Counter("c", "c", ["k"], registry=registry).labels(k="a")
    gauge = Gauge("g", "g", ["k"], registry=registry).labels(k="a")
    histogram = Histogram("h", "h", ["k"], buckets=BUCKETS, registry=registry).labels(k="a")
    return counter, gauge, histogram


def test_a_flushed_tally_gives_the_samples_of_direct_updates() -> None:
    direct, tallied, tally = CollectorRegistry(), CollectorRegistry(), Tally()
    counter, gauge, histogram = _series(direct)
    t_counter, t_gauge, t_histogram = _series(tallied)
    for value in VALUES:
        counter.inc(2)
        gauge.inc()
        histogram.observe(value)
        tally.add(t_counter, 2)
        tally.add(t_gauge, 1)
        tally.observe(t_histogram, value)
    gauge.dec()
    tally.add(t_gauge, -1)
    assert _samples(tallied) != _samples(direct), "nothing reaches the series before a flush"
    tally.flush()
    assert _samples(tallied) == _samples(direct)
    tally.flush()  # a second flush adds nothing
    assert _samples(tallied) == _samples(direct)


def test_a_histogram_without_the_parts_it_reads_is_observed_directly() -> None:
    class Plain:
        def __init__(self) -> None:
            self.seen: list[float] = []

        def observe(self, value: float) -> None:
            self.seen.append(value)

    tally, plain = Tally(), Plain()
    tally.observe(plain, 0.5)  # type: ignore[arg-type]
    assert plain.seen == [0.5]
    tally.flush()
    assert plain.seen == [0.5]


def test_a_read_of_the_service_registry_flushes_the_tally_first() -> None:
    metrics = Metrics()
    child = metrics.requests.labels(route="/v1/chat/completions", status="200", replica="r0")
    metrics.tally.add(child)
    metrics.tally.observe(metrics.latency.labels(route="/v1/chat/completions"), 0.02)
    labels = {"route": "/v1/chat/completions", "status": "200", "replica": "r0"}
    assert metrics.registry.get_sample_value("grm_requests_total", labels) == 1.0
    assert metrics.registry.get_sample_value(
        "grm_request_duration_seconds_bucket",
        {"route": "/v1/chat/completions", "le": "0.025"}) == 1.0
    assert b'grm_requests_total{replica="r0"' in metrics.render()


_WORKER = textwrap.dedent("""
    import sys
    from grm_service.metrics import Metrics
    values, tallied = [float(v) for v in sys.argv[2].split(",")], sys.argv[1] == "tally"
    metrics = Metrics(multiprocess_dir=__import__("pathlib").Path(sys.argv[3]))
    counter = metrics.tokens.labels(kind="prompt")
    latency = metrics.latency.labels(route="/classify")
    gauge = metrics.inflight.labels(replica="r0")
    for value in values:
        if tallied:
            metrics.tally.add(counter, 3)
            metrics.tally.add(gauge, 1)
            metrics.tally.observe(latency, value)
        else:
            counter.inc(3)
            gauge.inc()
            latency.observe(value)
    sys.stdout.buffer.write(metrics.render())
""")


def test_multiprocess_files_hold_the_same_totals(tmp_path: Path,
                                                 request: pytest.FixtureRequest) -> None:
    """Each run in a process of its own, its values in multiprocess files (the env variable
    is read when prometheus_client is imported): the rendered text is the same either way."""
    out = {}
    for kind in ("direct", "tally"):
        folder = tmp_path / kind
        folder.mkdir()
        run = subprocess.run(
            [sys.executable, "-c", _WORKER, kind, ",".join(map(str, VALUES)), str(folder)],
            env={"PROMETHEUS_MULTIPROC_DIR": str(folder), "PATH": "/usr/bin:/bin",
                 "PYTHONPATH": str(Path(request.config.rootpath))},
            capture_output=True, check=True, timeout=60)
        out[kind] = sorted(line for line in run.stdout.decode().splitlines()
                           if line.startswith(("grm_tokens", "grm_request_duration",
                                               "grm_requests_in_flight")))
    assert out["direct"] and out["tally"] == out["direct"]
    assert 'grm_request_duration_seconds_bucket{le="+Inf",route="/classify"} 8.0' in out["tally"]
