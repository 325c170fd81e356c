"""The whole service on a GPU (issue 8): `grm-service serve --engine vllm`, then `verify`.

Starts, side by side on the visible GPUs: **fixed** (defaults: batch invariance, the plugin, the
canary, `--serialize auto`); **unfixed** (plugin off, canary off, `--serialize off`: what
batch invariance plus a seed gives without this service's sampler fix); with GRM_GPU_BENCH=1 also
**plain** (VLLM_BATCH_INVARIANT=0) for the throughput comparison. OCR-style requests (an image +
the OCR prompt, temperature 0.7, top_p 0.8). Results go to GRM_GPU_RESULTS (JSON).

Env: GRM_GPU_MODEL (a model folder), GRM_GPU_KIND=vl|text, GRM_GPU_GPUS (default 0),
GRM_GPU_REPLICAS (default 2), GRM_GPU_ENGINE_ARGS (extra, e.g. "--tensor-parallel-size 2"),
GRM_GPU_MEM (gpu-memory-utilization per replica, default 0.17), GRM_GPU_UNFIXED_REPLICAS.
vLLM instances starting together on one GPU see each other's allocations while profiling
memory: more than three at once failed on H200 ("No available memory for the cache blocks").
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from grm_service.commands.prober import verify
from tests.support.procs import Proc, start_gateway, wait_ready

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None or not os.environ.get("GRM_GPU_MODEL"),
                       reason="needs a CUDA GPU, vllm and GRM_GPU_MODEL"),
]

OCR_PROMPT = ("Please output only the text content from the image without any additional "
              "descriptions or formatting.")
SAMPLING = {"temperature": 0.7, "top_p": 0.8, "max_tokens": 64, "logprobs": True}


def _record(key: str, value: Any) -> None:
    path = os.environ.get("GRM_GPU_RESULTS")
    if path:
        old = json.loads(Path(path).read_text()) if Path(path).exists() else {}
        Path(path).write_text(json.dumps(old | {key: value}, indent=2))


def _image(i: int) -> str:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (224, 224), "white")
    draw = ImageDraw.Draw(img)
    for line in range(3):
        draw.text((10, 20 + 60 * line), f"item {i} line {line} {'xyz' * (i % 4)}", fill="black")
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def ocr_requests(n: int) -> list[dict[str, Any]]:
    vl = os.environ.get("GRM_GPU_KIND", "vl") == "vl"
    bodies = []
    for i in range(n):
        content: Any = ([{"type": "image_url", "image_url": {"url": _image(i)}},
                         {"type": "text", "text": OCR_PROMPT}] if vl
                        else f"Transcribe item {i}: {'lorem ipsum ' * (1 + i % 6)}")
        bodies.append({"messages": [{"role": "system", "content": "You are a helpful assistant."},
                                    {"role": "user", "content": content}], **SAMPLING})
    return bodies


def _serve_args(replicas: str, tp: int = 1) -> list[str]:
    extra = os.environ.get("GRM_GPU_ENGINE_ARGS", "").split()
    extra += ["--tensor-parallel-size", str(tp)] if tp > 1 else []
    mm = ["--limit-mm-per-prompt", '{"image": 1}'] if os.environ.get("GRM_GPU_KIND",
                                                                      "vl") == "vl" else []
    return ["--model", os.environ["GRM_GPU_MODEL"], "--engine", "vllm", "--dtype", "bfloat16",
            "--max-model-len", "4096", "--served-model-name", "m", "--replicas", replicas,
            "--gpus", os.environ.get("GRM_GPU_GPUS", "0"), "--",
            "--gpu-memory-utilization", os.environ.get("GRM_GPU_MEM", "0.17"),
            "--max-num-seqs", "256", "--generation-config", "vllm", *mm, *extra]


Spec = tuple[str, dict[str, str], int]


def _specs() -> dict[str, Spec]:
    replicas = os.environ.get("GRM_GPU_REPLICAS", "2")
    specs = {
        "fixed": (replicas, {}, 1),
        "unfixed": (os.environ.get("GRM_GPU_UNFIXED_REPLICAS", replicas),
                    {"GRM_CANARY": "false", "GRM_SERIALIZE": "off",
                     "GRM_ENGINE_ENV": json.dumps({"GRM_VLLM_PLUGIN": "off"})}, 1),
    }
    if os.environ.get("GRM_GPU_TP2"):
        specs["tp2"] = ("1", {}, 2)  # one replica over two GPUs
    if os.environ.get("GRM_GPU_BENCH"):
        specs["plain"] = ("1", {"GRM_CANARY": "false", "GRM_SERIALIZE": "off",
                                "GRM_ENGINE_ENV": json.dumps({"VLLM_BATCH_INVARIANT": "0"})}, 1)
    return specs


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Proc]]:
    work = Path(os.environ.get("GRM_GPU_LOG_DIR") or tmp_path_factory.mktemp("gpu"))
    started = time.monotonic()
    procs = {name: start_gateway(work, *_serve_args(replicas, tp), env=env)
             for name, (replicas, env, tp) in _specs().items()}
    try:
        for name, proc in procs.items():
            wait_ready(proc, 900)
            _record(f"ready_s_{name}", round(time.monotonic() - started, 1))
        yield procs
    finally:
        for proc in procs.values():
            proc.stop(timeout=60)


def _rows(report: Any) -> list[dict[str, Any]]:
    return [{"condition": r.condition, "identical": r.identical, "total": r.total}
            for r in report.rows]


def test_verify_fixed_and_unfixed(services: dict[str, Proc]) -> None:
    bodies = ocr_requests(32)

    names = [name for name in services if name != "plain"]

    async def all_of_them() -> list[Any]:
        return list(await asyncio.gather(*(verify(services[n].url, bodies) for n in names)))

    reports = dict(zip(names, asyncio.run(all_of_them()), strict=True))
    for name, report in reports.items():
        _record(f"verify_{name}", _rows(report))
        _record(f"fingerprint_{name}", httpx.get(services[name].url + "/v1/fingerprint").json())
        _record(f"ready_{name}", httpx.get(services[name].url + "/ready").json())
    assert all(reports[n].ok for n in names if n != "unfixed"), {
        n: _rows(r) for n, r in reports.items()}


async def _load(urls: list[str], body: dict[str, Any], n: int) -> dict[str, float]:
    """n requests at once (distinct seeds), spread round-robin over urls; after a warm-up."""
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None)) as c:
        async def one(i: int) -> int:
            url = urls[i % len(urls)]
            r = await c.post(url + "/v1/chat/completions", json={**body, "seed": i})
            r.raise_for_status()
            return int(r.json()["usage"]["completion_tokens"])

        await asyncio.gather(*(one(i) for i in range(32)))  # warm-up
        start = time.perf_counter()
        tokens = await asyncio.gather(*(one(i) for i in range(n)))
        seconds = time.perf_counter() - start
    return {"requests": n, "seconds": round(seconds, 2), "req_per_s": round(n / seconds, 1),
            "output_tok_per_s": round(sum(tokens) / seconds)}


def test_throughput_256_concurrent(services: dict[str, Proc]) -> None:
    body = {**ocr_requests(1)[0], "max_tokens": 128, "ignore_eos": True, "model": "m"}

    def replicas(name: str) -> list[str]:
        ready = httpx.get(services[name].url + "/ready").json()
        return [r["url"] for r in ready["replicas"]]

    fixed = replicas("fixed")
    results = {
        "direct_fixed_all": asyncio.run(_load(fixed, body, 256)),
        "gateway_fixed": asyncio.run(_load([services["fixed"].url], body, 256)),
    }
    if "plain" in services:
        results["direct_fixed_r0"] = asyncio.run(_load(fixed[:1], body, 256))
        results["direct_plain_r0"] = asyncio.run(_load(replicas("plain")[:1], body, 256))
    _record("throughput_256", results)
    assert all(r["requests"] == 256 for r in results.values())
