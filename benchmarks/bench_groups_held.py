"""Held groups (grm_service/scoring/groups/held.py): what holding adds to the last item of a
group, and what 10,000 open groups cost a serving process in memory.

Latency. A group of `--size` items is judged by the same judge (a deterministic function that
waits `--judge-ms`, standing in for the engine's answer) in three ways, `--groups` times each:

- `one request`: the whole group in one call of the judge (what a group sent in one request
  costs on top of its judging: nothing here);
- `held, one process`: size - 1 items wait in this process, then the last item comes; the time
  from its call to its own result, and to the moment every waiter has its result;
- `held, two processes`: size - 1 items of every group wait in ANOTHER process (a worker of the
  same service), then the last item comes here: it claims and judges; the other process's
  waiters read the results at their next look (GRM_GROUP_POLL_S).

Added latency = a held row's time minus `one request`'s, median and p99 over the groups.

Memory. `--open` groups of 2 are opened in this process, each with one item waiting (a request
held open), with a completion of `--item-bytes`; the process's RSS before and after (VmRSS),
per group, and the groups file's size. The items live in the file: what a waiting group costs
in memory is its request's waiting task and its group's event.

    .venv/bin/python benchmarks/bench_groups_held.py [--size 8] [--groups 200] [--judge-ms 20]
        [--open 10000] [--item-bytes 2000] [--poll-s 0.02]

CPU only (the judge is a stand-in: holding never touches the engine). Prints two tables.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from harness.cpu import rss_kib

from grm_service.scoring.batch import item_digest
from grm_service.scoring.groups.held import HeldGroups, HoldSettings
from grm_service.scoring.models import ItemResult, ScoreItem


def hold(path: Path, poll_s: float, max_open: int) -> HoldSettings:
    return HoldSettings(path=path, timeout_s=600.0, max_open=max_open, lease_s=30.0,
                        poll_s=poll_s, keep_s=600.0)


def judge_of(judge_ms: float) -> Any:
    async def judge(items: list[ScoreItem]) -> dict[str, ItemResult]:
        await asyncio.sleep(judge_ms / 1000)
        ranked = sorted(items, key=lambda i: (i.completion or "", i.id))
        return {i.id: ItemResult(id=i.id, score=r / len(items), status="ok",
                                 digest=item_digest(i.id, r / len(items), None))
                for r, i in enumerate(ranked)}

    return judge


def members(group: str, size: int, first: int, last: int, item_bytes: int = 64) -> list[ScoreItem]:
    pad = "x" * max(0, item_bytes - 16)
    return [ScoreItem(id=f"{group}-{i}", completion=f"{i} {pad}", group_id=group,
                      group_size=size) for i in range(first, last)]


async def one_request(size: int, groups: int, judge: Any) -> list[float]:
    times = []
    for g in range(groups):
        items = members(f"one-{g}", size, 0, size)
        began = time.perf_counter()
        await judge(items)
        times.append(time.perf_counter() - began)
    return times


async def held_here(held: HeldGroups, size: int, groups: int, judge: Any,
                    ) -> tuple[list[float], list[float]]:
    last, every = [], []
    for g in range(groups):
        name = f"here-{g}"
        waiting = [asyncio.create_task(held.score_held(name, size, [m], judge))
                   for m in members(name, size, 0, size - 1)]
        await asyncio.sleep(0.25)  # they have joined and sleep: only the last item is timed
        began = time.perf_counter()
        await held.score_held(name, size, members(name, size, size - 1, size), judge)
        last.append(time.perf_counter() - began)
        await asyncio.gather(*waiting)
        every.append(time.perf_counter() - began)
    return last, every


def waiter_process(path: str, poll_s: float, size: int, groups: int, judge_ms: float,
                   pipe: Connection) -> None:
    """size - 1 items of every group wait here; each group's arrival time goes back."""

    async def run() -> None:
        held = HeldGroups(hold(Path(path), poll_s, groups + 10))
        await held.start()
        judge = judge_of(judge_ms)
        arrived: dict[str, float] = {}

        async def one(name: str) -> None:
            await asyncio.gather(*(held.score_held(name, size, [m], judge)
                                   for m in members(name, size, 0, size - 1)))
            arrived[name] = time.time()

        tasks = [asyncio.create_task(one(f"there-{g}")) for g in range(groups)]
        while await held.open_groups() < groups:  # every group's first items have joined
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # and their waiters sleep
        pipe.send("waiting")
        await asyncio.gather(*tasks)
        pipe.send(arrived)
        await held.close()

    asyncio.run(run())


async def held_there(held: HeldGroups, path: Path, poll_s: float, size: int, groups: int,
                     judge_ms: float, judge: Any) -> tuple[list[float], list[float]]:
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    child = multiprocessing.get_context("spawn").Process(
        target=waiter_process, args=(str(path), poll_s, size, groups, judge_ms, theirs))
    child.start()
    await asyncio.to_thread(ours.recv)
    last, sent = [], {}
    for g in range(groups):
        name = f"there-{g}"
        sent[name] = time.time()
        began = time.perf_counter()
        await held.score_held(name, size, members(name, size, size - 1, size), judge)
        last.append(time.perf_counter() - began)
        await asyncio.sleep(poll_s)  # one group at a time: each figure is its own group's
    arrived: dict[str, float] = await asyncio.to_thread(ours.recv)
    child.join()
    return last, [arrived[n] - sent[n] for n in sent]


async def memory(path: Path, open_groups: int, item_bytes: int) -> dict[str, float]:
    held = HeldGroups(hold(path, 0.05, open_groups + 10))
    await held.start()
    judge = judge_of(0)
    await held.score_held("warm", 1, members("warm", 1, 0, 1), judge)
    before = rss_kib()
    tasks = []
    for g in range(open_groups):
        name = f"open-{g}"
        tasks.append(asyncio.create_task(held.score_held(
            name, 2, members(name, 2, 0, 1, item_bytes), judge)))
        if g % 500 == 499:
            await asyncio.sleep(0)
    while await held.open_groups() < open_groups:
        await asyncio.sleep(0.1)
    after = rss_kib()
    file_bytes = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await held.close()
    return {"before": before, "after": after, "file": file_bytes}


def ms(values: list[float]) -> str:
    values = sorted(values)
    p99 = values[min(len(values) - 1, round(0.99 * (len(values) - 1)))]
    return f"{statistics.median(values) * 1000:.2f} | {p99 * 1000:.2f}"


async def main(args: argparse.Namespace) -> None:
    judge = judge_of(args.judge_ms)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "groups.sqlite"
        held = HeldGroups(hold(path, args.poll_s, args.groups * 2 + 10))
        await held.start()
        base = await one_request(args.size, args.groups, judge)
        here_last, here_all = await held_here(held, args.size, args.groups, judge)
        there_last, there_all = await held_there(held, path, args.poll_s, args.size,
                                                 args.groups, args.judge_ms, judge)
        await held.close()
    base_ms = statistics.median(base)
    rows = [("one request (the judge alone)", base, None),
            ("held, one process: the last item", here_last, here_last),
            ("held, one process: every item", here_all, here_all),
            ("held, two processes: the last item", there_last, there_last),
            ("held, two processes: every item", there_all, there_all)]
    print(f"groups of {args.size}, judge {args.judge_ms:g} ms, {args.groups} groups each, "
          f"GRM_GROUP_POLL_S={args.poll_s:g}")
    print("| case | ms median | ms p99 | added ms, median |")
    print("|---|---|---|---|")
    for name, values, added in rows:
        extra = "-" if added is None else f"{(statistics.median(added) - base_ms) * 1000:.2f}"
        print(f"| {name} | {ms(values)} | {extra} |")
    with tempfile.TemporaryDirectory() as tmp:
        mem = await memory(Path(tmp) / "groups.sqlite", args.open, args.item_bytes)
    grown = (mem["after"] - mem["before"]) * 1024
    print()
    print(f"{args.open} groups open in one process, one waiting item each "
          f"({args.item_bytes}-byte completions)")
    print("| RSS before | RSS after | grown | per open group | groups file |")
    print("|---|---|---|---|---|")
    print(f"| {mem['before'] / 1024:.1f} MiB | {mem['after'] / 1024:.1f} MiB | "
          f"{grown / 2**20:.1f} MiB | {grown / args.open / 1024:.2f} KiB | "
          f"{mem['file'] / 2**20:.1f} MiB |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--judge-ms", type=float, default=20.0)
    parser.add_argument("--open", type=int, default=10_000)
    parser.add_argument("--item-bytes", type=int, default=2000)
    parser.add_argument("--poll-s", type=float, default=0.02)
    asyncio.run(main(parser.parse_args(sys.argv[1:])))
