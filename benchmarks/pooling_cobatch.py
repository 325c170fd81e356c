"""Does the engine co-batch a VLM reward head's pooling invariantly? A short measurement.

N distinct requests (an image and a prompt each) to one replica's `/classify`, raw outputs
(`use_activation: false`), sent three ways: one at a time (alone), all N at once (co-batched,
up to the replica's --max-num-seqs), and the N shuffled among N fillers (other images), all at
once. A request's outputs must be bitwise the same in all three for pooling to be batch-invariant
(`Capabilities.pooling_invariant`); the table gives how many of the N differ from alone, and the
images per second of each way.

By default it starts one `grm-service replica` replica of the tiny VLM reward model
(`tiny_models` kind `vlm-reward`) with the engine profile `--engine`, `--max-num-seqs` N, float32
on CPU; `--url` measures a replica already running instead. On a GPU machine with vLLM:

    python benchmarks/pooling_cobatch.py --engine vllm --n 64
    python benchmarks/pooling_cobatch.py --engine vllm --n 64 \
        --engine-env '{"VLLM_BATCH_INVARIANT": "1"}'

On CPU: `.venv/bin/python benchmarks/pooling_cobatch.py --engine vllm-cpu --n 16`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import procs

from grm_service.tiny_models import ensure_tiny_model

SERVED = "tiny-vlm-rm"


def image_url(index: int) -> str:
    picture = Image.new("RGB", (112, 56), (index * 37 % 256, index * 91 % 256, 200))
    ImageDraw.Draw(picture).text((4, 20), f"IMG {index}", fill="black")
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def body(index: int) -> dict[str, object]:
    content = [{"type": "image_url", "image_url": {"url": image_url(index)}},
               {"type": "text", "text": f"prompt number {index}: a picture of a thing"}]
    return {"model": SERVED, "use_activation": False,
            "messages": [{"role": "user", "content": content}]}


async def send(client: httpx.AsyncClient, url: str, index: int) -> str:
    answer = await client.post(url + "/classify", json=body(index), timeout=600)
    answer.raise_for_status()
    return json.dumps(answer.json()["data"][0]["probs"])  # the floats' shortest repr: bitwise


async def measure(url: str, n: int) -> dict[str, tuple[int, float]]:
    """Per way: (requests of the N whose outputs differ from alone, images per second)."""
    async with httpx.AsyncClient() as client:
        await send(client, url, 0)  # warm-up
        began = time.perf_counter()
        alone = [await send(client, url, i) for i in range(n)]
        ways = {"alone": (0, n / (time.perf_counter() - began))}
        began = time.perf_counter()
        together = await asyncio.gather(*(send(client, url, i) for i in range(n)))
        ways["co-batched"] = (sum(a != b for a, b in zip(alone, together, strict=True)),
                              n / (time.perf_counter() - began))
        order = list(range(2 * n))  # n..2n-1: fillers
        random.Random(7).shuffle(order)
        began = time.perf_counter()
        mixed = dict(zip(order, await asyncio.gather(*(send(client, url, i) for i in order)),
                         strict=True))
        ways["shuffled+filler"] = (sum(alone[i] != mixed[i] for i in range(n)),
                                   2 * n / (time.perf_counter() - began))
    return ways


@contextmanager
def replica(engine: str, n: int, engine_env: str) -> Iterator[str]:
    model = ensure_tiny_model("vlm-reward")
    port = procs.free_port()
    with tempfile.TemporaryDirectory(prefix="grm-pooling-") as work:
        dtype = ["--dtype", "float32"] if engine == "vllm-cpu" else []
        argv = [sys.executable, "-m", "grm_service.cli", "replica", "--model", str(model),
                "--port", str(port), "--engine", engine, *dtype, "--max-model-len", "512",
                "--served-model-name", SERVED, "--work-dir", work,
                "--", "--enforce-eager", "--max-num-seqs", str(n)]
        log = Path(work) / "replica.log"
        env = {**os.environ, "GRM_ENGINE_ENV": engine_env}
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait(f"http://127.0.0.1:{port}", proc, log)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(60)


def wait(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"replica exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/grm/identity", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit("replica not ready after 900 s")


def table(ways: dict[str, tuple[int, float]], n: int, where: str) -> str:
    lines = [f"pooling co-batching, {n} requests, {where}",
             "| way | differ from alone | images/s |", "|---|---|---|"]
    lines += [f"| {way} | {diff}/{n} | {rate:.2f} |" for way, (diff, rate) in ways.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="a running replica of the model (else one is started)")
    parser.add_argument("--engine", default="vllm-cpu", choices=("vllm-cpu", "vllm"))
    parser.add_argument("--engine-env", default="{}", help="JSON env for the started replica")
    parser.add_argument("--n", type=int, default=16)
    args = parser.parse_args()
    if args.url:
        print(table(asyncio.run(measure(args.url, args.n)), args.n, args.url))
        return
    with replica(args.engine, args.n, args.engine_env) as url:
        where = f"{args.engine}, env {args.engine_env}"
        print(table(asyncio.run(measure(url, args.n)), args.n, where))


if __name__ == "__main__":
    main()
