"""How long one CPU replica takes to start and to answer its first request, caches cold and warm.

Starts `grm-service replica` on the tiny text model with the test suite's engine flags, one
after the other, times each from the command's start to its /health answering 200, then sends
it one request with logprobs (the suite's sampling) and times the answer. A variant is where
the replica's caches live (`GRM_CACHE_DIR`: vLLM's cache and torch inductor's):

- `cold`: a new, empty cache dir for every start (what every start paid while each replica had
  a vLLM cache of its own in a new work dir);
- `inductor-per-start`: one cache dir for every start, but inductor's cache new for each (set
  through `GRM_ENGINE_ENV`): what every start paid while inductor's cache was in the replica's
  own temp dir, its first request compiling the sampler's kernels and their C++ header;
- `shared`: one cache dir for every start, inductor's cache in it, as a service's replicas and
  its later runs share it; its first start is cold, the others find the model class's
  inspection and the compiled kernels made.

CPU is the process group's after the first answer, reaped children included (vLLM's inspection
subprocess, the compiler).

    .venv/bin/python benchmarks/replica_start.py [--starts 3] [--compiled] [-- ENGINE ARGS...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from harness import cpu, procs, servers

from grm_service.engines.base import ReplicaSpec

VARIANTS = ("cold", "inductor-per-start", "shared")


def start_once(f: procs.Fleet, model: str, env: dict[str, str], work: Path, name: str,
               engine_args: list[str]) -> tuple[float, float, float]:
    """Seconds to /health, seconds of the first answer, CPU seconds by then."""
    port = procs.free_port()
    argv = servers.replica_argv(model, port, work / name, engine_args)
    started = time.monotonic()
    proc = f.spawn(name, argv, f"http://127.0.0.1:{port}", env=env)
    procs.wait_ready(proc, "/health", timeout=600)
    wall = time.monotonic() - started
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 8, "temperature": 0.7, "top_p": 0.8, "logprobs": True}
    asked = time.monotonic()
    status, _ = procs.http_post_json(proc.url + "/v1/chat/completions", body, timeout=600)
    first = time.monotonic() - asked
    if status != 200:
        raise RuntimeError(f"first request answered {status}:\n{proc.tail()}")
    used = cpu.cpu_seconds(proc.pid, reaped=True)
    proc.stop()
    # The backend became the engine, so its temp dir is left for the next start to sweep.
    ReplicaSpec(name="r0", index=0, port=port, work_dir=work / name / "r0").sweep_stale_tmp()
    return wall, first, used


def variant_env(variant: str, root: Path, i: int) -> dict[str, str]:
    cache = root / (f"cache-{i}" if variant == "cold" else "cache-shared")
    env = {"GRM_CACHE_DIR": str(cache)}
    if variant == "inductor-per-start":
        env["GRM_ENGINE_ENV"] = json.dumps({"TORCHINDUCTOR_CACHE_DIR": str(root / f"ind-{i}")})
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=3, help="starts per variant")
    parser.add_argument("--compiled", action="store_true",
                        help="without --enforce-eager: vLLM compiles the model")
    parser.add_argument("engine_args", nargs="*", help="more engine args (after --)")
    args = parser.parse_args()
    model = servers.tiny_model()
    engine_args = ([] if args.compiled else ["--enforce-eager"]) + args.engine_args
    rows = []
    with procs.fleet() as f, tempfile.TemporaryDirectory(prefix="grm-start-") as tmp:
        root = Path(tmp)
        for variant in VARIANTS:
            runs = [start_once(f, model, variant_env(variant, root, i), root / "work",
                               f"{variant}{i}", engine_args) for i in range(args.starts)]
            rows.append(row(variant, runs))
    print("| caches | wall s to /health, each start | median after the first | first answer s, "
          "each | CPU s, each | CPU s, median after the first |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


def row(variant: str, runs: list[tuple[float, float, float]]) -> str:
    def each(column: int) -> str:
        return " / ".join(f"{run[column]:.1f}" for run in runs)

    def later(column: int) -> float:
        return statistics.median(run[column] for run in (runs[1:] or runs))

    return (f"| {variant} | {each(0)} | {later(0):.1f} | {each(1)} | {each(2)} | "
            f"{later(2):.1f} |")


if __name__ == "__main__":
    main()
