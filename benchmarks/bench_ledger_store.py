"""The ledger store's write cost as its table grows: CPU seconds (user + system, the writer's
thread is all this process runs) per record of `Store.write`, batch after batch, on a SQLite file
with the real schema. Records are chat-sized (a short answer, the fingerprint, no body), each
with its own request digest, in three variants, one file each:

- `chat`: records the cache may not answer (chat's default policy): not in the lookup index;
- `score`: records the cache may answer (`/v1/score`'s default): in the lookup index, whose key
  is one 64-bit integer (`store.lookup_key`);
- `text index`: the first schema's index on the text columns (fingerprint id, request digest),
  on every record, rebuilt here for the comparison.

    .venv/bin/python benchmarks/bench_ledger_store.py [--rows 200000] [--batch 1000] [--cache-kib N]

Prints a table: rows in the table at the end of each segment, the mean CPU us per record written
in that segment, per variant.
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


VARIANTS = ("chat", "score", "text index")


def _batch(first: int, n: int, indexed: bool) -> list[Record]:
    return [Record(time.time(), _ORIGIN, "/v1/chat/completions", "grm-0123456789abcdef",
                   hashlib.blake2b(str(i).encode(), digest_size=16).hexdigest(), "d" * 32,
                   None, _ANSWER, dict(_FIELDS), indexed=indexed)
            for i in range(first, first + n)]


def _curve(path: Path, rows: int, batch: int, variant: str, points: int,
           cache_kib: int | None) -> list[float]:
    store = SqliteStore(path)
    if cache_kib is not None:
        store._db.execute(f"PRAGMA cache_size = -{cache_kib}")
    if variant == "text index":  # the store no longer makes it: built here to compare
        store._db.execute("CREATE INDEX ledger_request ON ledger (fingerprint_id, "
                          "request_digest)")
    every = max(1, rows // batch // points)
    out, spent = [], 0.0
    for k in range(rows // batch):
        records = _batch(k * batch, batch, indexed=variant == "score")
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
                        help="SQLite's page cache for each (its default: 2,000 KiB)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        curves = [_curve(Path(tmp) / f"{i}.sqlite", args.rows, args.batch, variant, args.points,
                         args.cache_kib) for i, variant in enumerate(VARIANTS)]
    step = args.rows // len(curves[0])
    print("| rows in the table | " + " | ".join(f"{v}: CPU us/record" for v in VARIANTS) + " |")
    print("|---" * (len(VARIANTS) + 1) + "|")
    for i, row in enumerate(zip(*curves, strict=True)):
        print(f"| {(i + 1) * step:,} | " + " | ".join(f"{x:.1f}" for x in row) + " |")


if __name__ == "__main__":
    main()
