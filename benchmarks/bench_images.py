"""Gateway CPU per image request: the image check alone, and the whole gateway on STUB replicas.

Two realistic PNGs are generated (no files shipped): a 224 x 224 RGB crop of a noisy scan
(~114 KB, the H200 OCR benchmark's size) and a grey document page at ~200 dpi with text lines
and scanner noise (~2 MB). For each:

- **check**: CPU per call, in this process, of the image check as the gateway ran it before
  (CPython base64 with validation, then Pillow's full decode) and now
  (`checkpoint.check_body` on the chat body: pybase64, header, framing);
- **gateway**: CPU seconds of the gateway process (all threads, minus its idle rate) per chat
  request carrying the image, sent one at a time over a kept-alive connection to a gateway in
  attach mode on two STUB replicas; `--before DIR` adds the same run of the `grm_service`
  package in DIR (e.g. a checkout of main) as the "before" column;
- **byte floor**: the same measure for `byte_floor.py`, a server that does only the body's byte
  work over the same sockets (read into one buffer, crc32, blake3, the image's base64 decode,
  forwarded in one write): what hashing and copying the bytes cost, the bound the gateway's
  column is read against;
- **steps** (second table): CPU per call of each whole-body step of the hot path, as each
  tree's own code runs it, in a child interpreter per tree: the JSON shape bound, the parse,
  the image check, the canonical JSON, its crc32 (route digest) and blake3 (request digest).
  What the gateway column adds on top is the sockets, the event loop and the answer.

Targets (issue: image requests cost what their bytes cost): <= 1 ms per 114 KB request and
<= 5 ms per 2 MB request of gateway CPU.

    .venv/bin/python benchmarks/bench_images.py [--before DIR] [--requests 200] [--perf]

`--perf` then records the checkout's gateway with Linux `perf` (a software clock, call stacks
off) while it serves each image for `--perf-seconds`, and prints its user and system CPU per
request and the symbols that hold the most samples: where the bytes' cost goes (hashing,
copies, base64, the kernel's socket copies) and what the interpreter adds.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import os
import re
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import procs, rounds, servers
from harness.images import chat_body, scan_page
from PIL import Image

from grm_service.canonical import canonical_json
from grm_service.gateway.request.checkpoint import Limits, check_body
from grm_service.gateway.request.images import ImageLimits

# Nothing but the clients' requests: no audit's re-run, no canary's probes.
QUIET = {"GRM_AUDIT_FRACTION": "0", "GRM_CANARY": "false"}


def images() -> dict[str, bytes]:
    return {"224x224 crop": scan_page(224, 224, 0.31, "RGB"),
            "page scan": scan_page(1700, 2200, 0.025)}


def old_check(body: dict[str, object]) -> None:
    """What the gateway did per image before: validating base64 decode, full Pillow decode."""
    url = body["messages"][0]["content"][0]["image_url"]["url"]  # type: ignore[index]
    data = base64.b64decode(url.partition(",")[2], validate=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Image.open(io.BytesIO(data)) as img:
            img.load()


def cpu_per_call(fn: Callable[[], None], calls: int) -> float:
    samples = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(calls):
            fn()
        samples.append((time.process_time() - start) / calls)
    return statistics.median(samples)


def gateway_cpu_ms(gateway: procs.Proc, body: bytes, requests: int) -> float:
    host, port = gateway.url.rsplit("/", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = {"content-type": "application/json"}

    def send() -> None:
        conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
        answer = conn.getresponse()
        payload = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"gateway answered {answer.status}: {payload[:300]!r}")

    for _ in range(5):  # warm-up: connections, caches
        send()
    idle_start, idle_cpu = time.monotonic(), gateway.cpu()
    time.sleep(2.0)
    idle_rate = (gateway.cpu() - idle_cpu) / (time.monotonic() - idle_start)
    start, cpu = time.monotonic(), gateway.cpu()
    for _ in range(requests):
        send()
    used = gateway.cpu() - cpu - idle_rate * (time.monotonic() - start)
    conn.close()
    return used / requests * 1e3


def measured_in_rounds(targets: dict[str, procs.Proc], body: bytes, requests: int,
                       count: int) -> dict[str, list[float]]:
    """`gateway_cpu_ms` of each server, `count` times, in `rounds.order` (this machine's speed
    drifts over a run: a fixed order would favour one side)."""
    samples: dict[str, list[float]] = {column: [] for column in targets}
    for r in range(count):
        for column in rounds.order(list(targets), r):
            samples[column].append(gateway_cpu_ms(targets[column], body, requests))
    return samples


def perf_profile(gateway: procs.Proc, body: bytes, seconds: float, top: int = 20) -> str:
    """User and system CPU per request, and perf's top symbols (by own samples), while the
    gateway serves `body` one request at a time for `seconds`."""
    host, port = gateway.url.rsplit("/", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    out = procs.LOG_DIR / f"perf-{gateway.pid}.data"
    recorder = subprocess.Popen(
        ["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-p", str(gateway.pid),
         "-o", str(out), "--", "sleep", str(seconds + 1)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)
    before, started, requests = gateway.user_system(), time.monotonic(), 0
    while time.monotonic() - started < seconds:
        conn.request("POST", "/v1/chat/completions", body=body,
                     headers={"content-type": "application/json"})
        conn.getresponse().read()
        requests += 1
    after = gateway.user_system()
    conn.close()
    _, err = recorder.communicate(timeout=seconds + 60)
    if recorder.returncode != 0:
        return f"perf record failed: {err.decode(errors='replace')[-500:]}"
    report = subprocess.run(
        ["perf", "report", "-i", str(out), "--no-children", "--sort", "dso,symbol", "--stdio",
         "-g", "none", "--percent-limit", "0.5"], capture_output=True, text=True, check=False)
    # perf pads its columns (and adds two for the stack columns it leaves empty): squeezed.
    lines = [re.sub(r"(\s+-)*\s*$", "", re.sub(r" {2,}", "  ", line))
             for line in report.stdout.splitlines()
             if line.strip() and not line.startswith("#")][:top]
    user, system = ((a - b) / requests * 1e3 for a, b in zip(after, before, strict=True))
    return (f"{requests} requests: user {user:.2f} ms + system {system:.2f} ms per request\n"
            + "\n".join(lines))


def hot_path_steps(body: dict[str, object]) -> dict[str, float]:
    """ms of CPU per call of each whole-body step, as the grm_service on sys.path runs it."""
    import zlib

    from grm_service import fingerprint
    from grm_service.gateway.edge import hotpath
    from grm_service.gateway.request import checkpoint, router
    from grm_service.gateway.request.shape import check_json_shape

    raw = json.dumps(body).encode()
    limits = Limits(ImageLimits(max_bytes=20 << 20, max_pixels=40_000_000))
    try:  # this branch: long strings lifted at parse, spliced into the canonical JSON
        from grm_service.gateway.request import longstrings
    except ImportError:
        parse: Callable[[], Any] = lambda: (hotpath.load_json(raw), None)  # noqa: E731
        canonical: Callable[[Any, Any], list[Any]] = (  # noqa: E731
            lambda b, _: [canonical_json(b)])
        check: Callable[[Any, Any], None] = (  # noqa: E731
            lambda b, _: check_body("/v1/chat/completions", b, limits))
    else:
        def parse() -> Any:
            lifted = longstrings.Lifted()
            return hotpath.load_json(raw, lifted), lifted
        try:  # one canonical module: the splice moved there
            from grm_service.canonical import canonical_parts as canonical
        except ImportError:
            canonical = longstrings.canonical_parts

        def check(b: Any, lifted: Any) -> None:  # as proxy.check runs it
            checkpoint.check_images(checkpoint.scan("/v1/chat/completions", b, limits), limits,
                                    lifted)
    parsed, lifted = parse()
    parts = canonical(parsed, lifted)
    assert b"".join(parts) == json.dumps(parsed, sort_keys=True, separators=(",", ":"),
                                         ensure_ascii=False).encode()
    crc: Callable[[list[Any]], int] = getattr(router, "route_digest_of_parts",
                                              lambda p: zlib.crc32(p[0]))
    blake: Callable[[list[Any]], str] = getattr(fingerprint, "parts_digest",
                                                lambda p: fingerprint.digest(p[0]))
    calls = 50 if len(raw) < 500_000 else 10
    steps = {
        "shape": lambda: check_json_shape(raw, 64, 1_000_000),
        "parse": parse,
        "image check": lambda: check(parsed, lifted),
        "canonical JSON": lambda: canonical(parsed, lifted),
        "crc32 (key)": lambda: crc(parts),
        "blake3 (digest)": lambda: blake(parts),
    }
    return {name: cpu_per_call(fn, calls) * 1e3 for name, fn in steps.items()}


def steps_in_child(src: Path, image: str) -> dict[str, float]:
    """`hot_path_steps` in a fresh interpreter with the package in `src` first on its path."""
    out = subprocess.run([str(procs.MAIN_PY), __file__, "--steps-of", image], check=True,
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": procs.pythonpath(src)})
    return dict(json.loads(out.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, default=None,
                        help="folder holding the grm_service package to compare against")
    parser.add_argument("--requests", type=int, default=200, help="per image (page: a quarter)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure each server this many times per image, the order rotated "
                        "each round; the tables give medians, the spread is printed after them")
    parser.add_argument("--perf", action="store_true",
                        help="profile the checkout's gateway per image with perf (see above)")
    parser.add_argument("--perf-seconds", type=float, default=6.0)
    parser.add_argument("--check-sizes", action="store_true",
                        help="only the image check's CPU per call for pages of 2, 4 and 8 MB: "
                        "how long it holds the event loop (proxy.OFF_LOOP_IMAGE_CHARS)")
    parser.add_argument("--steps-of", default=None, help=argparse.SUPPRESS)  # the child's mode
    args = parser.parse_args()
    if args.steps_of:
        print(json.dumps(hot_path_steps(chat_body(images()[args.steps_of]))))
        return
    if args.check_sizes:
        print_check_sizes()
        return
    pictures = images()
    limits = Limits(ImageLimits(max_bytes=20 << 20, max_pixels=40_000_000))
    rows = []
    profiles: dict[str, str] = {}
    spreads: dict[str, dict[str, list[float]]] = {}
    with procs.fleet() as f:
        stubs = [servers.start_stub(f, i) for i in range(2)]
        urls = [s.url for s in stubs]
        trees = {"after": procs.REPO}
        if args.before:
            trees = {"before": args.before.resolve(), **trees}
        gateways = {label: servers.start_grm(f, urls, f"grm-{label}", src, serialize=None,
                                             env_extra=QUIET)
                    for label, src in trees.items()}
        floor = servers.start_floor(f, urls[0])
        steps = {(name, label): steps_in_child(src, name)
                 for name in pictures for label, src in trees.items()}
        for name, raw in pictures.items():
            body = chat_body(raw)
            encoded = json.dumps(body).encode()
            calls = 50 if len(raw) < 500_000 else 10
            row = {"image": name, "png_kb": len(raw) / 1000, "body_kb": len(encoded) / 1000,
                   "check_before_ms": cpu_per_call(lambda b=body: old_check(b), calls) * 1e3,
                   "check_after_ms": cpu_per_call(
                       lambda b=body: check_body("/v1/chat/completions", b, limits), calls) * 1e3}
            count = args.requests if len(raw) < 500_000 else max(20, args.requests // 4)
            targets = {f"gateway_{label}_ms": g for label, g in gateways.items()}
            targets["byte_floor_ms"] = floor
            samples = measured_in_rounds(targets, encoded, count, args.rounds)
            row.update({column: statistics.median(ms) for column, ms in samples.items()})
            spreads[name] = samples
            rows.append(row)
            if args.perf:
                profiles[name] = perf_profile(gateways["after"], encoded, args.perf_seconds)
    print_table(rows, list(gateways))
    if args.rounds > 1:
        for name, samples in spreads.items():
            print(f"{name}, each round (ms): " + "; ".join(
                f"{column.removesuffix('_ms')} " + " / ".join(f"{ms:.2f}" for ms in values)
                for column, values in samples.items()))
    print_steps(steps, list(pictures), list(gateways))
    for name, profile in profiles.items():
        print(f"\n{name}, the checkout's gateway under perf:\n{profile}")
    print("\ntargets: gateway CPU <= 1 ms per 114 KB request, <= 5 ms per 2 MB request")
    print("rerun: .venv/bin/python benchmarks/bench_images.py " + " ".join(sys.argv[1:]))


def print_check_sizes() -> None:
    limits = Limits(ImageLimits(max_bytes=64 << 20, max_pixels=100_000_000))
    print("| page | PNG MB | base64 Mi characters | check, ms CPU per call |\n|---|---|---|---|")
    for width, height in [(1700, 2200), (2400, 3100), (3400, 4400)]:
        body = chat_body(scan_page(width, height, 0.025))
        url = body["messages"][0]["content"][0]["image_url"]["url"]  # type: ignore[index]
        ms = cpu_per_call(lambda b=body: check_body("/v1/chat/completions", b, limits), 10)
        print(f"| {width} x {height} | {len(url) * 3 / 4e6:.2f} | {len(url) / 2**20:.2f} | "
              f"{ms * 1e3:.2f} |")


def print_table(rows: list[dict[str, object]], labels: list[str]) -> None:
    columns = ["image", "png_kb", "body_kb", "check_before_ms", "check_after_ms",
               *[f"gateway_{label}_ms" for label in labels], "byte_floor_ms"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        cells = [f"{row[c]:.2f}" if isinstance(row[c], float) else str(row[c]) for c in columns]
        print("| " + " | ".join(cells) + " |")


def print_steps(steps: dict[tuple[str, str], dict[str, float]], names: list[str],
                labels: list[str]) -> None:
    columns = [f"{name}, {label}" for name in names for label in labels]
    print("\n| step (us CPU per call) | " + " | ".join(columns) + " |")
    print("|" + "---|" * (len(columns) + 1))
    for step in [*steps[(names[0], labels[0])], "sum"]:
        cells = [sum(steps[(n, lb)].values()) if step == "sum" else steps[(n, lb)][step]
                 for n in names for lb in labels]
        print(f"| {step} | " + " | ".join(f"{c * 1e3:.1f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
