"""The ledger's figures, on STUB replicas (no model runs): bytes per record, a cache hit's CPU
against a forwarded request's, and a 10,000-request replay.

- **bytes**: /v1/score batches of OCR items (a 224 x 224 noisy scan, ~114 KB, the OCR
  benchmark's size: harness/images.py) and of judge items (a prompt, a completion of ~1 KB,
  a reference), each run tagged; per record: the canonical body, the answer, the fingerprint,
  and the SQLite file's pages per record. STUB answers are short: an engine's adds its text.
- **cache**: gateway CPU seconds (all threads) per /v1/score item, the same batch sent again and
  again, to a gateway with the cache on (every item a hit) and to one with it off (every item
  forwarded to a STUB).
- **replay**: 10,000 distinct chat requests recorded through a gateway, timed, then
  `grm-service replay` of the run against the same gateway at the same concurrency, timed,
  with its differences.

    .venv/bin/python benchmarks/bench_ledger.py [--replay 10000] [--concurrency 64]

Writes benchmarks/results/ledger.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import httpx
from harness import procs, servers
from harness.images import scan_page
from harness.procs import RESULTS

from grm_service.ledger.query import all_records
from grm_service.ledger.records import fields_json
from grm_service.ledger.sqlite import SqliteStore
from grm_service.ledger.store import Selection

OCR_BATCH = 64
JUDGE_BATCH = 256
COMPLETION = " ".join(["The answer follows from the second step of the derivation."] * 16)


def ledger_of(proc: procs.Proc) -> Path:
    return procs.LOG_DIR / f"work-{proc.name}-{proc.url.rsplit(':', 1)[1]}" / "ledger.sqlite"


def ocr_items(n: int) -> list[dict[str, str]]:
    images = [base64.b64encode(scan_page(224, 224, 0.31, "RGB", seed=i)).decode()
              for i in range(4)]
    return [{"id": f"o{i}", "image": "data:image/png;base64," + images[i % 4],
             "reference": f"invoice total {i}"} for i in range(n)]


def judge_items(n: int) -> list[dict[str, str]]:
    return [{"id": f"j{i}", "prompt": f"Question {i}: what is {i} + {i}?",
             "completion": f"{COMPLETION} So it is {2 * i}.", "reference": str(2 * i)}
            for i in range(n)]


def score(url: str, scorer: str, items: list[dict[str, str]], run: str) -> None:
    r = httpx.post(url + "/v1/score", json={"scorer": scorer, "items": items}, timeout=600,
                   headers={"x-grm-run": run, "x-grm-step": "0"})
    r.raise_for_status()


def measure_bytes(f: procs.Fleet, backends: list[str]) -> list[str]:
    gw = servers.start_grm(f, backends, "ledger-bytes",
                         env_extra={"GRM_LEDGER_CACHE_SCORE": "false"})
    path = ledger_of(gw)
    lines = ["| request | records | body B | answer B | fingerprint B | on disk B/record |",
             "|---|---|---|---|---|---|"]
    before = 0
    for run, scorer, items in (("ocr", "ocr", ocr_items(OCR_BATCH)),
                               ("judge", "judge", judge_items(JUDGE_BATCH))):
        score(gw.url, scorer, items, run)
        time.sleep(2)  # a few flush intervals
        store = SqliteStore(path, readonly=True)
        records = list(all_records(store, Selection(run=run)))
        store.close()
        n = len(records)
        body = sum(len(r.body or b"") for r in records) / n
        answer = sum(len(r.payload) for r in records) / n
        fields = sum(len(fields_json(r.fields)) for r in records) / n
        with closing(sqlite3.connect(path)) as db:
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            used = pages * db.execute("PRAGMA page_size").fetchone()[0]
        lines.append(f"| {run} | {n} | {body:,.0f} | {answer:,.0f} | {fields:,.0f} | "
                     f"{(used - before) / n:,.0f} |")
        before = used
    return lines


def cpu_per_item(gw: procs.Proc, items: list[dict[str, str]], rounds: int) -> float:
    score(gw.url, "judge", items, "warm")  # recorded (and, cache on, kept) once
    time.sleep(1)
    start = gw.cpu()
    for _ in range(rounds):
        score(gw.url, "judge", items, "again")
    return (gw.cpu() - start) / (rounds * len(items)) * 1e6


def measure_cache(f: procs.Fleet, backends: list[str], rounds: int) -> list[str]:
    items = judge_items(JUDGE_BATCH)
    hit = servers.start_grm(f, backends, "ledger-cache-on")
    forwarded = servers.start_grm(f, backends, "ledger-cache-off",
                                env_extra={"GRM_LEDGER_CACHE_SCORE": "false"})
    on, off = cpu_per_item(hit, items, rounds), cpu_per_item(forwarded, items, rounds)
    return ["| /v1/score item, judge | gateway CPU us/item |", "|---|---|",
            f"| forwarded to a STUB (cache off) | {off:,.0f} |",
            f"| answered from the ledger (cache on) | {on:,.0f} |"]


async def send_all(url: str, n: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def one(i: int) -> None:
            body = {"messages": [{"role": "user", "content": f"replay item {i}"}]}
            async with gate:
                r = await client.post(url + "/v1/chat/completions", json=body,
                                      headers={"x-grm-run": "bench", "x-grm-step": str(i // 64)})
            r.raise_for_status()

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - start


def measure_replay(f: procs.Fleet, backends: list[str], n: int, concurrency: int) -> list[str]:
    gw = servers.start_grm(f, backends, "ledger-replay")
    recorded_s = asyncio.run(send_all(gw.url, n, concurrency))
    time.sleep(2)
    start = time.perf_counter()
    done = subprocess.run([str(procs.MAIN_PY), "-m", "grm_service.cli", "replay",
                           str(ledger_of(gw)), "--url", gw.url, "--run", "bench",
                           "--concurrency", str(concurrency)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(procs.REPO), "COLUMNS": "120"}, check=False)
    replay_s = time.perf_counter() - start
    table = [line for line in done.stdout.splitlines() if "bench" in line]
    return ["| requests | recording run s | replay s (process start included) | exit | row |",
            "|---|---|---|---|---|",
            f"| {n} | {recorded_s:.1f} | {replay_s:.1f} | {done.returncode} | "
            f"{' '.join(table).replace('|', ' ').strip()} |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replay", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="repeats of the cached batch")
    args = parser.parse_args()
    sections = []
    with procs.fleet() as f:
        stubs = [servers.start_stub(f, i) for i in range(2)]
        backends = [s.url for s in stubs]
        sections.append(("Bytes per record", measure_bytes(f, backends)))
        sections.append(("Cache hit vs forward", measure_cache(f, backends, args.rounds)))
        sections.append(("Replay", measure_replay(f, backends, args.replay, args.concurrency)))
    text = "\n\n".join(f"### {title}\n\n" + "\n".join(rows) for title, rows in sections)
    text += f"\n\n`{' '.join(sys.argv)}`\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ledger.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
