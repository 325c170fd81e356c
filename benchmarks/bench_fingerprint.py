"""Model-hash cost: blake3 (as grm-service hashes) vs sha256, on a generated multi-GB folder.

Writes N random `.safetensors` files (default 4 x 512 MiB) to a temp folder, then per round:
- cache miss: `fingerprint.hash_files` (blake3, all cores, mmap), blake3 on one thread, and
  sha256 (hashlib.file_digest), each over every byte; the files sit in the page cache, since
  they were just written (`--drop-caches` also measures from disk: it drops the host's cache);
- cache hit: `fingerprint.model_hash(path, cache_dir)` with a warm cache (stat of each file).
The folder is deleted at the end, whatever happens.

    .venv/bin/python benchmarks/bench_fingerprint.py [--gib 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import blake3
from harness.rounds import spread

from grm_service import fingerprint

_CHUNK = 64 << 20


def make_model(root: Path, gib: float, files: int) -> int:
    size = int(gib * (1 << 30)) // files
    block = os.urandom(_CHUNK)  # random once; each file a rotation of it, so no dedup shortcuts
    for i in range(files):
        with (root / f"model-{i:05d}-of-{files:05d}.safetensors").open("wb") as out:
            left, shift = size, (i * 4099) % _CHUNK
            while left:
                piece = (block[shift:] + block[:shift])[: min(left, _CHUNK)]
                out.write(piece)
                left -= len(piece)
    (root / "config.json").write_text('{"architectures": ["Bench"]}')
    return sum(p.stat().st_size for p in root.iterdir())


def _blake3_one_thread(root: Path, files: list[Path]) -> str:
    hasher = blake3.blake3()
    for path in files:
        hasher.update_mmap(path)
    return str(hasher.hexdigest())


def _sha256(root: Path, files: list[Path]) -> str:
    hasher = hashlib.sha256()
    for path in files:
        with path.open("rb") as f:
            hasher.update(hashlib.file_digest(f, "sha256").digest())
    return hasher.hexdigest()


def _drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="parent of the temp folder (default /tmp)")
    parser.add_argument("--drop-caches", action="store_true",
                        help="also time from disk (drops the page cache of the whole host)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="grm-bench-model-", dir=args.dir))
    cache_dir = Path(tempfile.mkdtemp(prefix="grm-bench-cache-"))
    try:
        total = make_model(root, args.gib, args.files)
        files = fingerprint.model_files(root)
        methods: dict[str, Callable[[], object]] = {
            "blake3 (grm hash_files, all cores)": lambda: fingerprint.hash_files(root, files),
            "blake3 (1 thread)": lambda: _blake3_one_thread(root, files),
            "sha256 (hashlib)": lambda: _sha256(root, files),
        }
        times: dict[str, list[float]] = {name: [] for name in methods}
        if args.drop_caches:
            times |= {f"{name}, from disk": [] for name in methods}
        for _ in range(args.rounds):
            for name, fn in methods.items():
                times[name].append(_time(fn))
                if args.drop_caches:
                    _drop_caches()
                    times[f"{name}, from disk"].append(_time(fn))
        fingerprint.model_hash(str(root), cache_dir)  # fills the cache
        hits = [_time(lambda: fingerprint.model_hash(str(root), cache_dir))
                for _ in range(max(5, args.rounds))]
        _report(total, len(files), times, hits, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(cache_dir, ignore_errors=True)


def _report(total: int, nfiles: int, times: dict[str, list[float]], hits: list[float],
            rounds: int) -> None:
    gb = total / 1e9
    print(f"model folder: {gb:.2f} GB in {nfiles} files; {rounds} rounds; cores: {os.cpu_count()}")
    print("\n| method | seconds median [min-max] | GB/s median [min-max] |\n|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {spread(ts, '.3f')} "
              f"| {spread([gb / t for t in ts], '.2f')} |")
    med = statistics.median(hits)
    print(f"| model_hash, cache hit ({len(hits)} calls) | {med * 1e3:.3f} ms "
          f"[{min(hits) * 1e3:.3f}-{max(hits) * 1e3:.3f}] | {gb / med:.0f} (effective) |")


if __name__ == "__main__":
    main()
