"""Soak: a gateway serving for a long time, its replicas restarted under it, must not grow.

One gateway in attach mode on two STUB replicas (uvicorn, whose idle keep-alive is 5 s: vLLM's)
for `--minutes` (default 30). The load comes in bursts: `--concurrency` clients (default 64)
each send one chat request after another for `--burst-s`, then all are silent for `--gap-s`
(default 6 s, longer than the replicas' keep-alive: every connection the gateway kept to them
is closed by the replica, as a trainer's pauses between steps do to vLLM's). Every
`--restart-every-s` (default 120 s) one replica (r0, r1, r0, ...) is SIGKILLed in the middle of
a burst and started again on its port. At the end of each gap the gateway's RSS and open file
descriptors are sampled (the moment when no connection should be left but its listening socket
and its probes').

Pass: after `--warmup-s`, RSS and fds stay within 10 % of their first sample after it, and no
request was lost (every answer a 200). The samples that end a cycle with a restart are shown
but not judged: the re-admission's canary leaves its connections to the new replica open for
their keep-alive, a few seconds past the sample. The table shows each sample; the summary the
drift.

    nice -n 10 .venv/bin/python benchmarks/soak.py [--minutes 30] [--src DIR] [--concurrency 64]

`--src DIR` runs the `grm_service` package found in DIR (e.g. a checkout of an older commit).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from harness import cpu, procs, servers

BOUND = 0.10


@dataclass
class Tally:
    ok: int = 0
    lost: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def lose(self, why: str) -> None:
        self.lost += 1
        self.reasons[why] = self.reasons.get(why, 0) + 1


@dataclass
class Sample:
    at_s: float
    rss_mib: float
    fds: int
    ok: int
    lost: int
    restart: bool


async def burst(url: str, concurrency: int, seconds: float, tally: Tally, serial: list[int]
                ) -> None:
    """`concurrency` clients, each on its own connection, for `seconds`; closed after."""
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        async def one_client() -> None:
            while time.monotonic() < deadline:
                serial[0] += 1
                body = {"messages": [{"role": "user", "content": f"soak {serial[0]}"}],
                        "max_tokens": 8}
                try:
                    r = await client.post("/v1/chat/completions", json=body)
                except httpx.HTTPError as err:
                    tally.lose(type(err).__name__)
                    continue
                if r.status_code == 200:
                    tally.ok += 1
                else:
                    tally.lose(f"HTTP {r.status_code}")

        await asyncio.gather(*(one_client() for _ in range(concurrency)))


def start_stub(f: procs.Fleet, index: int, src: Path, port: int | None = None) -> procs.Proc:
    """A STUB replica of `src`'s grm_service; its answers wait 0.02 s, so requests overlap at
    the replica as generations do."""
    return servers.start_stub(f, index, 0.02, port=port, src=src, name=f"soak-stub{index}")


def restart(f: procs.Fleet, stubs: list[procs.Proc], index: int, src: Path) -> None:
    old = stubs[index]
    old.kill()
    f.procs.remove(old)
    stubs[index] = start_stub(f, index, src, int(old.url.rsplit(":", 1)[1]))


async def soak(args: argparse.Namespace, f: procs.Fleet, src: Path) -> list[Sample]:
    stubs = [start_stub(f, i, src) for i in range(2)]
    gateway = servers.start_grm(f, [s.url for s in stubs], "soak-gateway", src, serialize=None)
    tally, serial, samples = Tally(), [0], []
    start = time.monotonic()
    next_restart, restarts = start + args.restart_every_s, 0
    print("| t (s) | RSS (MiB) | open fds | answered | lost | replica restarted |")
    print("|---|---|---|---|---|---|")
    while time.monotonic() - start < args.minutes * 60:
        load = burst(gateway.url, args.concurrency, args.burst_s, tally, serial)
        restarting = time.monotonic() >= next_restart
        if restarting:
            async def kill_midway(index: int = restarts % 2) -> None:
                await asyncio.sleep(args.burst_s / 2)
                await asyncio.to_thread(restart, f, stubs, index, src)

            await asyncio.gather(load, kill_midway())
            restarts += 1
            next_restart += args.restart_every_s
        else:
            await load
        await asyncio.sleep(args.gap_s)
        sample = Sample(time.monotonic() - start, cpu.rss_kib(gateway.pid) / 1024,
                        len(os.listdir(f"/proc/{gateway.pid}/fd")), tally.ok, tally.lost,
                        restarting)
        samples.append(sample)
        print(f"| {sample.at_s:.0f} | {sample.rss_mib:.1f} | {sample.fds} | {sample.ok} | "
              f"{sample.lost} | {'yes' if restarting else ''} |", flush=True)
    if tally.reasons:
        print("lost:", ", ".join(f"{why} x{n}" for why, n in sorted(tally.reasons.items())))
    print(f"replica restarts: {restarts}")
    return samples


def verdict(samples: list[Sample], warmup_s: float) -> bool:
    after = [s for s in samples if s.at_s >= warmup_s and not s.restart]
    if len(after) < 2:
        print("too short: no samples after the warm-up")
        return False
    base, last = after[0], after[-1]
    rss_drift = max(s.rss_mib for s in after) / base.rss_mib - 1
    fd_drift = max(s.fds for s in after) / base.fds - 1
    hours = (last.at_s - base.at_s) / 3600
    slope = (last.rss_mib - base.rss_mib) / hours if hours else 0.0
    lost = samples[-1].lost
    passed = rss_drift <= BOUND and fd_drift <= BOUND and lost == 0
    print(f"\nafter {warmup_s:.0f} s of warm-up ({len(after)} samples, {base.at_s:.0f}-"
          f"{last.at_s:.0f} s): RSS {base.rss_mib:.1f} -> max {base.rss_mib * (1 + rss_drift):.1f}"
          f" MiB (+{rss_drift:.1%}; {slope:+.1f} MiB/h), fds {base.fds} -> max "
          f"{round(base.fds * (1 + fd_drift))} (+{fd_drift:.1%}), requests {samples[-1].ok} "
          f"answered, {lost} lost: {'PASS' if passed else 'FAIL'} (bound: +{BOUND:.0%}, 0 lost)")
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--burst-s", type=float, default=2.0)
    parser.add_argument("--gap-s", type=float, default=6.0)
    parser.add_argument("--restart-every-s", type=float, default=120.0)
    parser.add_argument("--warmup-s", type=float, default=60.0)
    parser.add_argument("--src", type=Path, default=procs.REPO,
                        help="folder holding the grm_service package to run")
    args = parser.parse_args()
    with procs.fleet() as f:
        samples = asyncio.run(soak(args, f, args.src.resolve()))
    passed = verdict(samples, args.warmup_s)
    print("rerun: nice -n 10 .venv/bin/python benchmarks/soak.py " + " ".join(sys.argv[1:]))
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
