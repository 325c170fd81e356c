"""verl's reward loop asks for one sample at a time: what each way of answering costs.

A gateway on two STUB replicas (no model: the cost measured is the client's and the gateway's)
scores N samples with the `trainer` test scorer (tests/support/scoring.py), three ways:

* `client per sample`: a blocking call per sample on verl's thread pool, each building its own
  HTTP client (what the adapter's sync `compute_score` did);
* `async, shared client`: the adapter's `async def compute_score`, N calls awaited together on
  one event loop, sharing one client (what verl 0.9's reward loop does with it);
* `one batch`: `compute_score_batch`, one request for the N samples.

    .venv/bin/python benchmarks/verl_reward.py [--samples 64] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from harness import procs, rounds, servers

from grm_service.client import GrmClient
from grm_service.integrations import verl

SCORERS = "trainer=tests.support.scoring:trainer_score"


def samples(n: int) -> list[tuple[str, str, str, dict[str, str]]]:
    return [("openai/gsm8k", f"answer {i}", str(i), {"question": f"q{i}"}) for i in range(n)]


def client_per_sample(url: str, n: int) -> None:
    def one(sample: tuple[str, str, str, dict[str, str]]) -> float:
        with GrmClient(url) as client:
            item = verl.to_item(0, *sample)
            return float(client.score([item], "trainer")[0].score or 0.0)

    with ThreadPoolExecutor() as pool:  # verl's run_in_executor: the default pool
        list(pool.map(one, samples(n)))


def async_shared(url: str, n: int) -> None:
    async def all_samples() -> None:
        await asyncio.gather(*(verl.compute_score(*s, url=url, scorer="trainer")
                               for s in samples(n)))
        await verl.close_clients()

    asyncio.run(all_samples())


def one_batch(url: str, n: int) -> None:
    rows = samples(n)
    verl.compute_score_batch([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                             [r[3] for r in rows], url=url, scorer="trainer", batch_size=n)


def timed(run: Callable[[str, int], None], url: str, n: int, runs: int) -> list[float]:
    run(url, n)  # warm-up
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        run(url, n)
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    ways = [("client per sample", client_per_sample), ("async, shared client", async_shared),
            ("one batch", one_batch)]
    with procs.fleet() as f:
        stubs = [servers.start_stub(f, i) for i in range(2)]
        gateway = servers.start_grm(f, [s.url for s in stubs], serialize=None,
                                    env_extra={"GRM_SCORERS": SCORERS})
        print(f"{args.samples} samples, {args.runs} runs, median [min-max] seconds")
        print(f"{'way':24} {'seconds':>22}")
        for name, run in ways:
            t = timed(run, gateway.url, args.samples, args.runs)
            print(f"{name:24} {rounds.spread(t, '.3f'):>22}")
    print(f"rerun: .venv/bin/python benchmarks/verl_reward.py --samples {args.samples} "
          f"--runs {args.runs}")


if __name__ == "__main__":
    main()
