"""How long one CPU replica takes to start, with vLLM's cache cold and warm.

Starts `grm-service backend` on the tiny text model with the test suite's engine flags, one
after the other, and times each from the command's start to its /health answering 200. A
variant is a cache dir (`GRM_CACHE_DIR`, where the replica's vLLM cache lives):

- `cold`: a new, empty one for every start (what every start paid while each replica had a vLLM
  cache of its own in a new work dir);
- `shared`: one for every start, as a service's replicas and its later runs share it; its first
  start is cold, the others find the model class's inspection (and any compiled graph) made.

CPU is the process group's at /health, reaped children included (vLLM's inspection subprocess).

    .venv/bin/python benchmarks/replica_start.py [--starts 3] [--compiled] [-- ENGINE ARGS...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs

from grm_service.tiny_models import ensure_tiny_model

# The suite's flags (tests/support/engines.py): float32, a short context, no compile.
FLAGS = ["--engine", "vllm-cpu", "--dtype", "float32", "--max-model-len", "512",
         "--served-model-name", "tiny"]


def start_once(f: procs.Fleet, model: Path, cache: Path, work: Path, name: str,
               engine_args: list[str]) -> tuple[float, float]:
    port = procs.free_port()
    argv = [str(procs.MAIN_PY), "-m", "grm_service.cli", "backend", "--model", str(model),
            "--port", str(port), *FLAGS, "--work-dir", str(work / name), "--", *engine_args]
    started = time.monotonic()
    proc = f.spawn(name, argv, f"http://127.0.0.1:{port}",
                   env={"GRM_CACHE_DIR": str(cache), "VLLM_CPU_OMP_THREADS_BIND": "0"})
    procs.wait_ready(proc, "/health", timeout=600)
    wall, cpu = time.monotonic() - started, procs.cpu_seconds(proc.pid, reaped=True)
    proc.stop()
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=3, help="starts per variant")
    parser.add_argument("--compiled", action="store_true",
                        help="without --enforce-eager: vLLM compiles the model")
    parser.add_argument("engine_args", nargs="*", help="more engine args (after --)")
    args = parser.parse_args()
    model = ensure_tiny_model("text")
    engine_args = ([] if args.compiled else ["--enforce-eager"]) + args.engine_args
    rows = []
    with procs.fleet() as f, tempfile.TemporaryDirectory(prefix="grm-start-") as tmp:
        root = Path(tmp)
        for variant in ("cold", "shared"):
            runs = []
            for i in range(args.starts):
                cache = root / (f"cache-{i}" if variant == "cold" else "cache-shared")
                runs.append(start_once(f, model, cache, root / "work", f"{variant}{i}",
                                       engine_args))
            walls = [w for w, _ in runs]
            later = walls[1:] or walls
            rows.append(f"| {variant} | {' / '.join(f'{w:.1f}' for w in walls)} | "
                        f"{statistics.median(later):.1f} | "
                        f"{' / '.join(f'{c:.1f}' for _, c in runs)} |")
    print("| cache | wall s to /health, each start | median after the first | CPU s, each |")
    print("|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
