"""What a request's metric updates cost the gateway: the seven updates of one answered request
(the requests counter, the latency histogram, the in-flight gauge up and down, two token
counters, one more counter add), straight to prometheus_client and through the tally
(`grm_service/tally.py`, a flush every 2,000 requests as a second of traffic would have it), in
one process and in multiprocess mode (`serve --workers N`: PROMETHEUS_MULTIPROC_DIR set before
prometheus_client is imported, so each case runs in a process of its own).

    .venv/bin/python benchmarks/bench_metrics.py [--requests 100000] [--repeats 3]

Prints us per request, the median of the repeats, for each of the four cases.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_CASE = """
import sys, time
from pathlib import Path
from grm_service.metrics import Metrics
requests, tallied, folder = int(sys.argv[1]), sys.argv[2] == "tally", sys.argv[3]
metrics = Metrics(multiprocess_dir=Path(folder) if folder else None)
counter = metrics.requests.labels(route="/v1/chat/completions", status="200", replica="r0")
latency = metrics.latency.labels(route="/v1/chat/completions")
gauge = metrics.inflight.labels(replica="r0")
prompt, completion = metrics.tokens.labels(kind="prompt"), metrics.tokens.labels(kind="completion")
tally = metrics.tally
start = time.perf_counter()
if tallied:
    for i in range(requests):
        tally.add(gauge, 1); tally.add(gauge, -1); tally.add(prompt, 12)
        tally.add(completion, 3); tally.add(counter); tally.observe(latency, 0.004)
        tally.add(counter, 0)
        if i % 2000 == 1999:
            tally.flush()
    tally.flush()
else:
    for i in range(requests):
        gauge.inc(); gauge.dec(); prompt.inc(12); completion.inc(3); counter.inc()
        latency.observe(0.004); counter.inc(0)
print((time.perf_counter() - start) / requests * 1e6)
"""


def _run(requests: int, mode: str, multiprocess: bool) -> float:
    with tempfile.TemporaryDirectory() as folder:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
        if multiprocess:
            env["PROMETHEUS_MULTIPROC_DIR"] = folder
        out = subprocess.run([sys.executable, "-c", _CASE, str(requests), mode,
                              folder if multiprocess else ""],
                             env=env, capture_output=True, text=True, check=True, timeout=300)
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cases = [(mode, mp) for mp in (False, True) for mode in ("direct", "tally")]
    times: dict[tuple[str, bool], list[float]] = {case: [] for case in cases}
    for _ in range(args.repeats):  # the cases in turn in each repeat: drift hits them alike
        for case in cases:
            times[case].append(_run(args.requests, *case))
    print("| metric updates of one request | one process, us | `--workers N` (multiprocess), us |")
    print("|---|---|---|")
    for mode in ("direct", "tally"):
        one, many = (statistics.median(times[(mode, mp)]) for mp in (False, True))
        label = "prometheus_client" if mode == "direct" else "through the tally"
        print(f"| {label} | {one:.2f} | {many:.2f} |")


if __name__ == "__main__":
    main()
