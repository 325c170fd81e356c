"""The ledger store's write cost as its table grows: CPU seconds (user + system, the writer's
thread is all this process runs) per record of `Store.write`, batch after batch, on a SQLite file
with the real schema, and the same with the cache's lookup index (`ledger_request`: fingerprint
id and request digest, a random key) dropped. Records are chat-sized (a short answer, the
fingerprint, no body), each with its own request digest.

    .venv/bin/python benchmarks/bench_ledger_store.py [--rows 200000] [--batch 1000] [--cache-kib N]

Prints a table: rows in the table at the end of each segment, the mean CPU us per record written
in that segment, with and without the index.
"""

from __future__ import annotations

import argparse
import hashlib
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
_ORIGIN = Origin("/v1/chat/completions")


def _batch(first: int, n: int) -> list[Record]:
    return [Record(time.time(), _ORIGIN, "/v1/chat/completions", "grm-0123456789abcdef",
                   hashlib.blake2b(str(i).encode(), digest_size=16).hexdigest(), "d" * 32,
                   None, _ANSWER, dict(_FIELDS)) for i in range(first, first + n)]


def _curve(path: Path, rows: int, batch: int, with_index: bool, points: int,
           cache_kib: int | None) -> list[float]:
    store = SqliteStore(path)
    if cache_kib is not None:
        store._db.execute(f"PRAGMA cache_size = -{cache_kib}")
    if not with_index:
        store._db.execute("DROP INDEX ledger_request")  # the variant: the store has no option
    every = max(1, rows // batch // points)
    out, spent = [], 0.0
    for k in range(rows // batch):
        records = _batch(k * batch, batch)
        start = time.process_time()
        store.write(records)
        spent += time.process_time() - start
        if k % every == every - 1:  # the mean over the segment's batches
            out.append(spent / (every * batch) * 1e6)
            spent = 0.0
    store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1000, help="records per write (a flush)")
    parser.add_argument("--points", type=int, default=5)
    parser.add_argument("--cache-kib", type=int, default=None,
                        help="SQLite's page cache for both (its default: 2,000 KiB)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        indexed = _curve(Path(tmp) / "indexed.sqlite", args.rows, args.batch, True, args.points,
                         args.cache_kib)
        plain = _curve(Path(tmp) / "plain.sqlite", args.rows, args.batch, False, args.points,
                       args.cache_kib)
    step = args.rows // len(indexed)
    print("| rows in the table | CPU us/record, schema as shipped | without ledger_request |")
    print("|---|---|---|")
    for i, (a, b) in enumerate(zip(indexed, plain, strict=True)):
        print(f"| {(i + 1) * step:,} | {a:.1f} | {b:.1f} |")


if __name__ == "__main__":
    main()
