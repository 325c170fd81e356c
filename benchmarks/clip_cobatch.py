"""Does a dual encoder's pooling co-batch invariantly on this engine? Bits alone vs co-batched.

Against a running replica of a CLIP/SigLIP model (`grm-service replica ...`, or vLLM itself):
each probe (texts of several lengths, PNGs of several sizes) is embedded alone, one request at a
time, then all at once among filler requests of other shapes, `--rounds` times in shuffled
orders; every co-batched vector must be bitwise the one it got alone. Prints one line per kind
and exits 1 where any differs: the measure behind the engine profile's `pooling_note`.

    python benchmarks/clip_cobatch.py --url http://127.0.0.1:8001 --model tiny-clip
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from typing import Any

import httpx

from grm_service.fingerprint import json_digest
from grm_service.probe_images import png_data_url


def probes(n: int) -> list[tuple[str, dict[str, Any]]]:
    texts = [("text", {"input": f"probe {i}: " + "a red bird on a wire " * (1 + i % 4)})
             for i in range(n)]
    images = [("image", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": png_data_url(32 + 24 * i, 48 + 8 * i, i)}}]}]})
        for i in range(n)]
    return texts + images


async def embed(client: httpx.AsyncClient, url: str, model: str, body: dict[str, Any]) -> str:
    r = await client.post(url + "/v1/embeddings", json={"model": model, **body}, timeout=600)
    r.raise_for_status()
    return json_digest(r.json()["data"])


async def engine_steps(client: httpx.AsyncClient, url: str) -> float:
    """vLLM's count of engine steps (`vllm:iteration_tokens_total_count`): fewer steps than
    requests means requests shared steps, i.e. were co-batched."""
    text = (await client.get(url + "/metrics", timeout=60)).text
    for line in text.splitlines():
        if line.startswith("vllm:iteration_tokens_total_count"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


async def measure(url: str, model: str, n: int, rounds: int) -> dict[str, tuple[int, int]]:
    """kind -> (vectors that differed co-batched, vectors compared)."""
    todo = probes(n)
    filler = [("filler", b) for _, b in probes(2 * n)[n // 2:]]
    counts = {"text": [0, 0], "image": [0, 0]}
    async with httpx.AsyncClient() as client:
        alone = [await embed(client, url, model, b) for _, b in todo]
        rng = random.Random(0)
        before = await engine_steps(client, url)
        for _ in range(rounds):
            mixed = list(enumerate(todo)) + [(-1, f) for f in filler]
            rng.shuffle(mixed)
            got = await asyncio.gather(*(embed(client, url, model, b) for _, (_, b) in mixed))
            for (index, (kind, _)), digest in zip(mixed, got, strict=True):
                if index >= 0:
                    counts[kind][0] += digest != alone[index]
                    counts[kind][1] += 1
        steps = await engine_steps(client, url) - before
    sent = rounds * (len(todo) + len(filler))
    sys.stdout.write(f"co-batched phase: {sent} requests in {steps:.0f} engine steps "
                     f"({sent / steps:.2f} requests per step)\n")
    return {k: (v[0], v[1]) for k, v in counts.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--probes", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    result = asyncio.run(measure(args.url.rstrip("/"), args.model, args.probes, args.rounds))
    for kind, (differ, total) in result.items():
        sys.stdout.write(f"{kind}: {differ}/{total} co-batched vectors differ from alone\n")
    sys.stdout.write(json.dumps({"invariant": not any(d for d, _ in result.values())}) + "\n")
    return 1 if any(d for d, _ in result.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
