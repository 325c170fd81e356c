"""Bitwise checks per sampling group: top_p, top_k, min_p, penalties, greedy.

Each group is the same prompts (half OCR images, half short judge texts, one seed each) under one
kind of sampling. An answer is its text and every token logprob, compared as exact JSON. The
reference is each request sent alone through the gateway; the other conditions send them all
groups together, shuffled, at 256 in flight (co-batched with each other), or pinned to one
replica (`x-grm-pin-replica`), so that the replicas on different GPUs are compared bit for bit.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import aiohttp
from bench_gateway_gpu import ocr_image

PIN_HEADER = "x-grm-pin-replica"  # grm_service.headers.PIN_HEADER; scripts never import the server
GROUPS: dict[str, dict[str, Any]] = {
    "top_p": {"temperature": 0.7, "top_p": 0.8},
    "top_k": {"temperature": 0.7, "top_k": 20},
    "min_p": {"temperature": 0.7, "min_p": 0.1},
    "penalties": {"temperature": 0.7, "presence_penalty": 0.5, "frequency_penalty": 0.5,
                  "repetition_penalty": 1.1},
    "greedy": {"temperature": 0.0},
}
Body = dict[str, Any]


def group_bodies(model: str, per_group: int, tokens: int) -> list[tuple[str, Body]]:
    """(group, body) pairs: per_group prompts in each group, the same prompts and seeds in all."""
    images = [ocr_image(i) for i in range(max(1, per_group // 2))]
    out: list[tuple[str, Body]] = []
    for group, sampling in GROUPS.items():
        for i in range(per_group):
            content: Any = (
                [{"type": "image_url", "image_url": {"url": images[i // 2]}},
                 {"type": "text", "text": "Transcribe the text in this image."}]
                if i % 2 == 0 else f"Question {i}: is answer {i * 7 % 13} correct? Explain.")
            out.append((group, {"model": model, "seed": 9000 + i, "max_tokens": tokens,
                                "logprobs": True, "ignore_eos": True, **sampling,
                                "messages": [{"role": "user", "content": content}]}))
    return out


async def answer(session: aiohttp.ClientSession, url: str, body: Body,
                 pin: str | None = None) -> tuple[str, dict[str, Any]]:
    """(the answer's bits as JSON, its grm_fingerprint); an HTTP error is an answer too."""
    headers = {PIN_HEADER: pin} if pin else {}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        payload: dict[str, Any] = await r.json(content_type=None)
    if r.status != 200:
        return f"HTTP {r.status}: {str(payload)[:200]}", {}
    bits = [(c["message"]["content"], c.get("logprobs")) for c in payload["choices"]]
    return json.dumps(bits), payload.get("grm_fingerprint", {})


async def answers(session: aiohttp.ClientSession, url: str, bodies: list[Body],
                  in_flight: int, pin: str | None = None,
                  shuffle: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """Each body's (answer bits, fingerprint), in input order, sent `in_flight` at a time."""
    order = list(range(len(bodies)))
    if shuffle:
        random.Random(11).shuffle(order)
    gate = asyncio.Semaphore(in_flight)

    async def one(i: int) -> tuple[int, tuple[str, dict[str, Any]]]:
        async with gate:
            return i, await answer(session, url, bodies[i], pin)

    got = dict(await asyncio.gather(*(one(i) for i in order)))
    return [got[i] for i in range(len(bodies))]


def bits(got: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [b for b, _ in got]


def differing(groups: list[str], reference: list[str], other: list[str]) -> dict[str, int]:
    """Per group, how many answers are not bitwise equal to the reference (errors count)."""
    out = {g: 0 for g in GROUPS}
    for group, ref, got in zip(groups, reference, other, strict=True):
        out[group] += int(ref != got or ref.startswith("HTTP "))
    return out


async def conditions(session: aiohttp.ClientSession, url: str, model: str, replicas: list[str],
                     per_group: int, tokens: int) -> dict[str, Any]:
    """The reference (alone) and each condition's differing counts, per group."""
    pairs = group_bodies(model, per_group, tokens)
    groups, bodies = [g for g, _ in pairs], [b for _, b in pairs]
    alone = await answers(session, url, bodies, 1)
    rows = {"co-batched, shuffled, 256 in flight": await answers(session, url, bodies, 256,
                                                                  shuffle=True)}
    for name in replicas:
        rows[f"pinned to {name}, 64 in flight"] = await answers(session, url, bodies, 64, name)
    reference = bits(alone)
    table = {cond: differing(groups, reference, bits(got)) for cond, got in rows.items()}
    print(f"  groups of {per_group}: differing from alone {json.dumps(table)}", flush=True)
    return {"per_group": per_group, "tokens": tokens, "differing": table, "groups": groups,
            "alone": alone}
