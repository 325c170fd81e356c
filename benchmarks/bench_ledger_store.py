"""The ledger store's write cost as it grows: CPU seconds (user + system: the writer's thread is
all this process runs) per record of `Store.write`, batch after batch (a batch: one flush), on a
SQLite file with the real schema. Records are chat-sized (a ~700-byte body, a short answer, the
fingerprint), each with its own request digest, in three variants, one file each:

- `chat`: records the cache may not answer (chat's default policy): not in the lookup index;
- `score`: records the cache may answer (`/v1/score`'s default): in the lookup index, whose key
  is one 64-bit integer (`store.lookup_key`);
- `chat, 4 KiB pages`: `chat` on a file of SQLite's default page size (a file that exists keeps
  its own: the ledger makes new ones with 16 KiB pages).

With `--ocr`, each record's answer is an OCR answer instead (`cpu_inprocess.py`'s: 12 KB, 128
tokens with logprobs): about a page of the file per record.

With `--before DIR` (a copy of an earlier `grm_service` package, e.g. `git archive REV
grm_service | tar -x -C DIR`), the same records go through that version's store too, in the same
run, for the comparison.

    .venv/bin/python benchmarks/bench_ledger_store.py [--rows 200000] [--batch 1000] [--before DIR]
        [--repeat K]

Prints a table: rows in the store at the end of each segment, the mean CPU us per record written
in that segment, per variant (the median of K runs, each variant in turn); its last line, the
bytes the batches hold per record (deterministic).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grm_service.ledger.records import Origin, Record
from grm_service.ledger.sqlite import SqliteStore

_FIELDS = {"fingerprint_id": "grm-0123456789abcdef", "identity": "verified", "seed": 42,
           "model_hash": "a" * 16, "env_digest": "b" * 16, "engine": "vllm",
           "engine_version": "0.25.0", "device": "cpu", "replica": "r0", "serialized": False,
           "request_digest": "c" * 32, "response_digest": "d" * 32}
_ANSWER = (b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"rm","choices":'
           b'[{"index":0,"message":{"role":"assistant","content":"7"},"finish_reason":"stop"}],'
           b'"usage":{"prompt_tokens":40,"completion_tokens":1,"total_tokens":41}}')
_BODY = (b'{"max_tokens":16,"messages":[{"content":"' + b"x" * 640
         + b'","role":"user"}],"seed":7,"temperature":0}')
_ORIGIN = Origin("/v1/chat/completions", "key-0123456789abcdef", "run-1", 3)
VARIANTS = ("chat", "score", "chat, 4 KiB pages")


def _batch(first: int, n: int, indexed: bool, answer: bytes = _ANSWER) -> list[Record]:
    return [Record(time.time(), _ORIGIN, "/v1/chat/completions", "grm-0123456789abcdef",
                   hashlib.blake2b(str(i).encode(), digest_size=16).hexdigest(), "d" * 32,
                   _BODY, answer, dict(_FIELDS), indexed=indexed)
            for i in range(first, first + n)]


def stored_bytes(path: Path) -> float:
    """What the batches hold per record: blobs, ends (with the shared texts) and digests."""
    with sqlite3.connect(path) as db:
        [(size, records)] = db.execute(
            "SELECT SUM(LENGTH(data) + LENGTH(ends) + LENGTH(digests)), SUM(records) "
            "FROM ledger_batches").fetchall()
    return float(size) / records


def curve(path: Path, rows: int, batch: int, variant: str, points: int,
          answer: bytes = _ANSWER) -> list[float]:
    if variant.endswith("4 KiB pages"):
        with sqlite3.connect(path) as db:  # the page size is fixed by the file's first table
            db.execute("PRAGMA page_size = 4096")
            db.execute("CREATE TABLE made (x)")
    store = SqliteStore(path)
    every = max(1, rows // batch // points)
    out, spent = [], 0.0
    for k in range(rows // batch):
        records = _batch(k * batch, batch, variant == "score", answer)
        start = time.process_time()
        store.write(records)
        spent += time.process_time() - start
        if k % every == every - 1:  # the mean over the segment's batches
            out.append(spent / (every * batch) * 1e6)
            spent = 0.0
    store.close()
    return [*out, stored_bytes(path)]


def _before(tree: str, tmp: str, args: argparse.Namespace) -> list[list[float]]:
    """The `chat` and `score` curves through the store of the package copy in `tree`."""
    code = ("import json, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
            "import bench_ledger_store as b; print(json.dumps([b.curve(Path(sys.argv[2]) / "
            "f'before-{v}.sqlite', int(sys.argv[3]), int(sys.argv[4]), v, int(sys.argv[5])) "
            "for v in ('chat', 'score')]))")
    # `-S`, the site folder by hand, and another working folder: the editable install's finder
    # and the working folder would otherwise import this checkout's package.
    site = next(p for p in sys.path if p.endswith("site-packages"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((tree, site))}
    out = subprocess.run([sys.executable, "-S", "-c", code, str(Path(__file__).parent), tmp,
                          str(args.rows), str(args.batch), str(args.points)],
                         env=env, cwd=tmp, check=True, capture_output=True, text=True).stdout
    curves: list[list[float]] = json.loads(out)
    return curves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1000, help="records per write (a flush)")
    parser.add_argument("--points", type=int, default=5)
    parser.add_argument("--before", help="a copy of an earlier grm_service package, to compare")
    parser.add_argument("--ocr", action="store_true",
                        help="records answered as cpu_inprocess.py's OCR answer (12 KB: 128 "
                        "tokens with logprobs) instead of a short chat answer")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every variant this many times, in turn; print the medians")
    args = parser.parse_args()
    if args.ocr and args.before:
        parser.error("--ocr compares nothing with --before: the earlier store gets chat records")
    names = list(VARIANTS) + (["before: chat", "before: score"] if args.before else [])
    runs = [_run_once(args) for _ in range(args.repeat)]
    curves = [[statistics.median(point) for point in zip(*same, strict=True)]
              for same in zip(*runs, strict=True)]
    step = args.rows // (len(curves[0]) - 1)
    print("| records in the store | " + " | ".join(f"{v}: CPU us/record" for v in names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for i, row in enumerate(zip(*curves, strict=True)):
        label = f"{(i + 1) * step:,}" if i < len(curves[0]) - 1 else "bytes stored per record"
        print(f"| {label} | " + " | ".join(f"{x:.1f}" for x in row) + " |")


def _run_once(args: argparse.Namespace) -> list[list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        answer = _ANSWER
        if args.ocr:  # imported here: `_before`'s child imports this module with an older tree
            from harness.stub_server import logprobs_answer
            answer = logprobs_answer(128)
        curves = [curve(Path(tmp) / f"{i}.sqlite", args.rows, args.batch, variant, args.points,
                        answer) for i, variant in enumerate(VARIANTS)]
        if args.before:
            curves += _before(args.before, tmp, args)
    return curves


if __name__ == "__main__":
    main()
