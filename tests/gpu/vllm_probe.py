"""Start real `vllm serve` processes and probe them with seeded top-p requests (issue 8)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.procs import Proc, free_port

SERVED_NAME = "m"
# The sampling of issue 8: top_p < 1 reaches the top-k/top-p filter, a seed fixes the draw.
SAMPLING: Mapping[str, Any] = {"temperature": 0.7, "top_p": 0.8}

# vLLM configures only its own logger; this also shows the plugin's one line per process.
_LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(levelname)s %(process)d %(name)s: %(message)s"}},
    "handlers": {"out": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "vllm": {"handlers": ["out"], "level": "INFO", "propagate": False},
        "grm_service": {"handlers": ["out"], "level": "INFO", "propagate": False},
    },
}


@dataclass(frozen=True)
class Answer:
    """What must be bitwise equal across batchings: the text, its tokens and their logprobs."""

    text: str
    tokens: tuple[str, ...]
    logprobs: tuple[float, ...]


def server_env(work: Path, overrides: Mapping[str, str]) -> dict[str, str]:
    config = work / "logging.json"
    config.write_text(json.dumps(_LOGGING))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "GRM_"))}
    return base | {
        "VLLM_USE_FLASHINFER_SAMPLER": "0",  # flashinfer is not installed on the device image
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_LOGGING_CONFIG_PATH": str(config),
        "PYTHONUNBUFFERED": "1",
        **overrides,
    }


def start_vllm(model: str, log: Path, env: Mapping[str, str], memory: float) -> Proc:
    port = free_port()
    argv = [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model,
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED_NAME,
        "--dtype", "bfloat16", "--max-model-len", "4096", "--max-num-seqs", "256",
        "--gpu-memory-utilization", str(memory), "--generation-config", "vllm",
    ]  # fmt: skip
    with log.open("wb") as out:
        popen = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=dict(env), start_new_session=True
        )
    return Proc(popen, f"http://127.0.0.1:{port}", log)


def wait_healthy(procs: list[Proc], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    waiting = list(procs)
    while waiting and time.monotonic() < deadline:
        for proc in list(waiting):
            if proc.popen.poll() is not None:
                raise AssertionError(f"vllm exited {proc.popen.returncode}:\n{proc.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(proc.url + "/health", timeout=5).status_code == 200:
                    waiting.remove(proc)
        time.sleep(1)
    if waiting:
        raise AssertionError(f"vllm not healthy after {timeout} s:\n{waiting[0].tail()}")


@contextlib.contextmanager
def running(
    specs: Mapping[str, Mapping[str, str]], model: str, work: Path
) -> Iterator[dict[str, Proc]]:
    """Start one server per spec (name -> env overrides) side by side; stop them all after."""
    memory = round(0.85 / len(specs), 2)
    procs: dict[str, Proc] = {}
    try:
        for name, overrides in specs.items():
            log = work / f"server-{name}.log"
            procs[name] = start_vllm(model, log, server_env(work, overrides), memory)
        wait_healthy(list(procs.values()), timeout=float(os.environ.get("GRM_GPU_START_S", "480")))
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


def seeded_requests(count: int, max_tokens: int = 64) -> list[dict[str, Any]]:
    return [
        {
            "model": SERVED_NAME,
            "prompt": f"Request {i}: describe item number {i * 7919 % 1000} in a few words.",
            "seed": 1000 + i,
            "max_tokens": max_tokens,
            "logprobs": 1,
            **SAMPLING,
        }
        for i in range(count)
    ]


def _answer(body: dict[str, Any]) -> Answer:
    choice = body["choices"][0]
    logprobs = choice["logprobs"]
    return Answer(choice["text"], tuple(logprobs["tokens"]), tuple(logprobs["token_logprobs"]))


async def _post_all(url: str, payloads: list[dict[str, Any]], at_once: bool) -> list[Answer]:
    limits = httpx.Limits(max_connections=len(payloads) + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one(payload: dict[str, Any]) -> Answer:
            response = await client.post("/v1/completions", json=payload)
            response.raise_for_status()
            return _answer(response.json())

        if at_once:
            return list(await asyncio.gather(*(one(p) for p in payloads)))
        return [await one(p) for p in payloads]


def one_at_a_time(url: str, payloads: list[dict[str, Any]]) -> list[Answer]:
    return asyncio.run(_post_all(url, payloads, at_once=False))


def all_at_once(url: str, payloads: list[dict[str, Any]]) -> list[Answer]:
    return asyncio.run(_post_all(url, payloads, at_once=True))


def differing(first: list[Answer], second: list[Answer]) -> dict[str, int]:
    """How many requests differ in text and in logprobs (compared as exact floats)."""
    pairs = list(zip(first, second, strict=True))
    return {
        "texts": sum(a.text != b.text for a, b in pairs),
        "logprobs": sum(a.logprobs != b.logprobs for a, b in pairs),
    }


def throughput(url: str, concurrent: int, tokens: int) -> dict[str, float]:
    """One warm-up round, then one timed round of `concurrent` requests of `tokens` tokens."""
    payloads = [p | {"ignore_eos": True} for p in seeded_requests(concurrent, tokens)]
    all_at_once(url, payloads)
    started = time.perf_counter()
    answers = all_at_once(url, payloads)
    seconds = time.perf_counter() - started
    generated = sum(len(a.tokens) for a in answers)
    return {
        "seconds": round(seconds, 3),
        "requests_per_s": round(concurrent / seconds, 2),
        "output_tokens_per_s": round(generated / seconds, 1),
    }


def plugin_lines(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if "vLLM plugin" in line]
