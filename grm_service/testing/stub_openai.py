"""STUB OpenAI-compatible backend: for testing and benchmarking the gateway itself.

It runs no model. `/v1/chat/completions` answers at once with a text derived from the request
bytes (so routing and fingerprint code see distinct, repeatable outputs), and can inject faults:
a fixed delay, 500s, or garbage (`--garbage html|json|hang`: every route answers a 200 HTML page,
a 200 of broken JSON, or never answers). Start: `python -m grm_service.testing.stub_openai
--port 0`; it prints `PORT <n>` on stdout once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import socket
import sys
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def _completion(body: dict[str, Any], raw: bytes) -> dict[str, Any]:
    text = "stub-" + hashlib.sha256(raw).hexdigest()[:16]
    return {
        "id": "chatcmpl-stub", "object": "chat.completion", "created": 0,
        "model": body.get("model", "stub"),
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


GARBAGE = {"html": (b"<html><body>It works!</body></html>", "text/html"),
           "json": (b'{"object": "list", "data": [', "application/json")}


def garbage_app(kind: str) -> Starlette:
    async def answer(_: Request) -> Response:
        if kind == "hang":
            await asyncio.sleep(3600)
        body, media = GARBAGE[kind]
        return Response(body, media_type=media)

    return Starlette(routes=[Route("/{path:path}", answer, methods=["GET", "POST"])])


def build_app(delay_s: float = 0.0, fail: bool = False, served_model_name: str = "rm",
              version: str = "stub") -> Starlette:
    async def health(_: Request) -> Response:
        return Response(status_code=500 if fail else 200)

    async def chat(request: Request) -> JSONResponse:
        raw = await request.body()
        if delay_s:
            await asyncio.sleep(delay_s)
        if fail:
            return JSONResponse({"error": {"message": "stub failure"}}, status_code=500)
        return JSONResponse(_completion(json.loads(raw), raw))

    async def engine_version(_: Request) -> JSONResponse:
        return JSONResponse({"version": version})

    async def models(_: Request) -> JSONResponse:
        # The fields the gateway's identity check reads from vLLM's /v1/models.
        return JSONResponse({"object": "list", "data": [
            {"id": served_model_name, "object": "model", "root": "stub", "max_model_len": 512}
        ]})

    return Starlette(routes=[
        Route("/health", health), Route("/version", engine_version), Route("/v1/models", models),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ])


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--served-model-name", default="rm")
    parser.add_argument("--version", default="stub", help="What /version reports.")
    parser.add_argument("--garbage", choices=["html", "json", "hang"], default=None)
    args = parser.parse_args()
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket says it is TCP; without it each keep-alive reply waits ~40 ms (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sys.stdout.write(f"PORT {sock.getsockname()[1]}\n")
    sys.stdout.flush()
    stub = (garbage_app(args.garbage) if args.garbage
            else build_app(args.delay, args.fail, args.served_model_name, args.version))
    config = uvicorn.Config(stub, log_level="warning")
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
