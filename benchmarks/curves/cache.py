"""The repeat of reward_curves.py: the same run again, against the same gateway and its ledger.

`--repeat-on-same-gateway` trains "grm A" a second time on the gateway that served the first
run, with nothing changed: the same policy seed, so the same completions as long as every reward
is the same. The ledger's cache should then answer every score item from the record. What is
counted, before and after each run (the counters, never a timer):

* the gateway's `/metrics`: `grm_score_items_total` (items scored), `grm_ledger_cache_total`
  by outcome (hit, coalesced, miss), `grm_audits_total` (hits and answers the live audit re-ran
  on a replica: a sampled recomputation, `GRM_AUDIT_FRACTION`);
* each replica's own vLLM `/metrics`: `vllm:request_success_total` (requests the engine
  finished) and its prompt and generation tokens: the engine's work, whoever asked for it.

The second run's rewards are compared bit for bit (`float.hex`) with the first run's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness import procs
from harness.servers import metric_total

# (sample name, labels it must carry) of each figure.
GATEWAY = {
    "items": ("grm_score_items_total", {}),
    "hit": ("grm_ledger_cache_total", {"outcome": "hit"}),
    "coalesced": ("grm_ledger_cache_total", {"outcome": "coalesced"}),
    "miss": ("grm_ledger_cache_total", {"outcome": "miss"}),
    "audits_run": ("grm_audits_total", {}),
    "audits_rate_limited": ("grm_audits_total", {"outcome": "rate_limited"}),
}
ENGINE = {
    "engine_requests": ("vllm:request_success_total", {}),
    "engine_prompt_tokens": ("vllm:prompt_tokens_total", {}),
    "engine_generation_tokens": ("vllm:generation_tokens_total", {}),
}


@dataclass
class Repeat:
    """The second run's curve and the counters' deltas over each run."""

    steps: list[dict[str, Any]]
    first: dict[str, float]
    second: dict[str, float]


def scrape(url: str, figures: dict[str, tuple[str, dict[str, str]]]) -> dict[str, float]:
    status, raw = procs.http_get(url + "/metrics", timeout=10)
    if status != 200:
        raise RuntimeError(f"{url}/metrics answered {status}")
    text = raw.decode()
    return {key: metric_total(text, name, labels) for key, (name, labels) in figures.items()}


def counters(gateway: str, engines: list[str]) -> dict[str, float]:
    """The gateway's figures and the engines' summed over replicas, once they stand still
    (vLLM updates its counters from its output loop, a moment after the answer)."""
    def read() -> dict[str, float]:
        out = scrape(gateway, GATEWAY)
        for url in engines:
            for key, value in scrape(url, ENGINE).items():
                out[key] = out.get(key, 0.0) + value
        out["audits_run"] -= out["audits_rate_limited"]  # skipped ones ran nothing
        return out

    last = read()
    for _ in range(20):
        time.sleep(1.0)
        now = read()
        if now == last:
            return now
        last = now
    return last


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in after}


def repeat(gateway: str, engines: list[str], first_run: Callable[[], list[dict[str, Any]]],
           again: Callable[[], list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], Repeat]:
    """Run `first_run`, then `again`, counting around each; the first run's steps too."""
    start = counters(gateway, engines)
    t0 = time.monotonic()
    first_steps = first_run()
    middle = counters(gateway, engines)
    t1 = time.monotonic()
    second_steps = again()
    end = counters(gateway, engines)
    t2 = time.monotonic()
    first = {**delta(start, middle), "wall_s": round(t1 - t0, 1)}
    second = {**delta(middle, end), "wall_s": round(t2 - t1, 1)}
    return first_steps, Repeat(second_steps, first, second)


def lines(data: dict[str, Any]) -> list[str]:
    """The repeat's verdict, where the JSON holds one."""
    found = data.get("repeat")
    runs = data["runs"]
    if not found or "grm A" not in runs or "grm A again" not in runs:
        return []
    a, b = runs["grm A"]["steps"], runs["grm A again"]["steps"]
    rewards = sum(len(s["rewards"]) for s in a)
    differ = sum(x != y for s, t in zip(a, b, strict=True)
                 for x, y in zip(s["rewards"], t["rewards"], strict=True))
    out = ["", "| grm A, same gateway | items | hit | coalesced | miss | from the cache | "
           "engine requests | engine tokens (prompt + generated) | audits run | wall s |",
           "|---" * 10 + "|"]
    for label, key in (("first run", "first"), ("second run", "second")):
        c = found[key]
        share = c["hit"] / c["items"] if c["items"] else math.nan
        tokens = c["engine_prompt_tokens"] + c["engine_generation_tokens"]
        out.append(f"| {label} | {c['items']:.0f} | {c['hit']:.0f} | {c['coalesced']:.0f} | "
                   f"{c['miss']:.0f} | {share:.1%} | {c['engine_requests']:.0f} | "
                   f"{tokens:.0f} | {c['audits_run']:.0f} | {c['wall_s']:.1f} |")
    same = "identical bit for bit" if differ == 0 else f"{differ} of {rewards} differ"
    out.append(f"grm A vs grm A again (same gateway, same ledger): {same}, {rewards} rewards "
               f"over {len(a)} steps")
    return out

