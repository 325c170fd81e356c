"""STUB OpenAI-compatible replica: for testing and benchmarking the gateway itself.

It runs no model. `/v1/chat/completions` answers at once with a text derived from the request
bytes (so routing and fingerprint code see distinct, repeatable outputs), `/v1/responses` with
the same text (its ids new each time, as an engine's), `/classify` with fixed probabilities,
and it can inject faults: a fixed delay, 500s, or garbage (`--garbage html|json|hang`: every
route answers a 200 HTML page, a 200 of broken JSON, or never answers,
writing `hang: holding <method> <path>` to stderr; SIGTERM ends it within a second).
With `--record N` it keeps the last N bodies it was sent (`GET /stub/received`, `DELETE
/stub/received` to clear), so a test can assert what reached an engine, or that nothing did;
`GET /stub/received?at=1` adds when each arrived (`time.time()`), to order it against a log.
`GET /stub/overlap` tells the most requests it held at once (`DELETE` starts over) and how many
it holds now: with `--delay`, a test can see whether requests that must run alone ever
overlapped. After `POST /stub/hold`, chat completions wait until `POST /stub/release`, so a
test can keep requests in flight for as long as its checks take, on a machine of any pace.
`--pad N` adds N characters to every chat answer's text (an answer larger than the gateway's cap).
`--api-key KEY` guards the routes vLLM's `--api-key` guards (`/v1/...`: 401 without the key).
Start: `python -m grm_service.testing.stub_openai --port 0`; it prints `PORT <n>` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import socket
import sys
import time
from collections import deque
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send


def completion(body: dict[str, Any], raw: bytes, pad: int = 0) -> dict[str, Any]:
    """The chat answer to the body `raw` (parsed: `body`)."""
    text = "stub-" + hashlib.sha256(raw).hexdigest()[:16] + "=" * pad
    return {
        "id": "chatcmpl-stub", "object": "chat.completion", "created": 0,
        "model": body.get("model", "stub"),
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def response(body: dict[str, Any], raw: bytes, answered: int) -> dict[str, Any]:
    """The Responses API answer to the body `raw`: the chat answer's text, its ids drawn anew
    for every answer (`answered`: how many came before), as vLLM's are."""
    text = "stub-" + hashlib.sha256(raw).hexdigest()[:16]
    return {
        "id": f"resp_stub{answered}", "object": "response", "created_at": time.time(),
        "model": body.get("model", "stub"), "status": "completed",
        "output": [{"id": f"msg_stub{answered}", "type": "message", "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}],
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                  "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }


CLASSIFY_ANSWER = {"object": "list", "data": [{"index": 0, "probs": [0.25, 0.75]}]}

GARBAGE = {"html": (b"<html><body>It works!</body></html>", "text/html"),
           "json": (b'{"object": "list", "data": [', "application/json")}


def garbage_app(kind: str) -> Starlette:
    async def answer(request: Request) -> Response:
        if kind == "hang":
            # One line per held request on stderr: a test counts the probes it has held.
            sys.stderr.write(f"hang: holding {request.method} {request.url.path}\n")
            sys.stderr.flush()
            await asyncio.sleep(3600)
        body, media = GARBAGE[kind]
        return Response(body, media_type=media)

    return Starlette(routes=[Route("/{path:path}", answer, methods=["GET", "POST"])])


def build_app(delay_s: float = 0.0, fail: bool = False, served_model_name: str = "rm",
              version: str = "stub", record: int = 0, pad: int = 0) -> Starlette:
    received: deque[dict[str, Any]] = deque(maxlen=record or 1)
    held = {"now": 0, "most": 0, "answered": 0}
    passing = asyncio.Event()  # cleared by POST /stub/hold, set by POST /stub/release
    passing.set()

    def keep(path: str, raw: bytes) -> None:
        if record:
            received.append({"path": path, "body": json.loads(raw), "at": time.time()})

    async def health(_: Request) -> Response:
        return Response(status_code=500 if fail else 200)

    async def chat(request: Request) -> JSONResponse:
        raw = await request.body()
        keep("/v1/chat/completions", raw)
        if delay_s or not passing.is_set():
            held["now"] += 1
            held["most"] = max(held["most"], held["now"])
            try:
                await asyncio.sleep(delay_s)
                await passing.wait()
            finally:
                held["now"] -= 1
        if fail:
            return JSONResponse({"error": {"message": "stub failure"}}, status_code=500)
        return JSONResponse(completion(json.loads(raw), raw, pad))

    async def responses(request: Request) -> JSONResponse:
        raw = await request.body()
        keep("/v1/responses", raw)
        held["answered"] += 1
        return JSONResponse(response(json.loads(raw), raw, held["answered"]))

    async def classify(request: Request) -> JSONResponse:
        raw = await request.body()
        keep("/classify", raw)
        return JSONResponse(CLASSIFY_ANSWER)

    async def seen(request: Request) -> JSONResponse:
        if request.method == "DELETE":
            received.clear()
        timed = request.query_params.get("at") == "1"
        return JSONResponse([item if timed else {k: v for k, v in item.items() if k != "at"}
                             for item in received])

    async def overlap(request: Request) -> JSONResponse:
        if request.method == "DELETE":
            held["most"] = held["now"]
        return JSONResponse({"max_in_flight": held["most"], "in_flight": held["now"]})

    async def hold(request: Request) -> JSONResponse:
        (passing.clear if request.url.path == "/stub/hold" else passing.set)()
        return JSONResponse({"holding": not passing.is_set()})

    async def metrics(_: Request) -> Response:
        # A line shaped like vLLM's own /metrics, enough for the gateway's relay of it.
        text = ("# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="{served_model_name}"}} {held["now"]}\n')
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def engine_version(_: Request) -> JSONResponse:
        return JSONResponse({"version": version})

    async def models(_: Request) -> JSONResponse:
        # The fields the gateway's identity check reads from vLLM's /v1/models.
        return JSONResponse({"object": "list", "data": [
            {"id": served_model_name, "object": "model", "root": "stub", "max_model_len": 512}
        ]})

    return Starlette(routes=[
        Route("/health", health), Route("/version", engine_version), Route("/metrics", metrics),
        Route("/v1/models", models),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/classify", classify, methods=["POST"]),
        Route("/stub/received", seen, methods=["GET", "DELETE"]),
        Route("/stub/overlap", overlap, methods=["GET", "DELETE"]),
        Route("/stub/hold", hold, methods=["POST"]), Route("/stub/release", hold, methods=["POST"]),
    ])


# The routes vLLM's `--api-key` guards (vllm/entrypoints/serve/middleware/authenticate.py).
GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")


def guarded(app: ASGIApp, key: str) -> ASGIApp:
    """The app behind a key, as vLLM's `--api-key` puts its server: a 401 on the guarded routes
    without `Authorization: Bearer <key>`, the rest (health, version, metrics) open."""
    async def guard(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(GUARDED_PREFIXES) \
                and Headers(scope=scope).get("authorization") != f"Bearer {key}":
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await app(scope, receive, send)
    return guard


def listening(port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:`port` (0: any free one), its port printed as `PORT n`
    once it listens: a client that connects while the server starts waits in the backlog
    instead of being refused (uvicorn's and asyncio's own listen() set the same backlog).
    IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only when the
    listening socket says it is TCP; without it each keep-alive reply waits ~40 ms (Nagle)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(2048)
    sys.stdout.write(f"PORT {sock.getsockname()[1]}\n")
    sys.stdout.flush()
    return sock


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--served-model-name", default="rm")
    parser.add_argument("--version", default="stub", help="What /version reports.")
    parser.add_argument("--garbage", choices=["html", "json", "hang"], default=None)
    parser.add_argument("--record", type=int, default=0, help="Keep the last N bodies received.")
    parser.add_argument("--pad", type=int, default=0, help="Characters added to chat answers.")
    parser.add_argument("--api-key", default="", help="Guard the /v1 routes as vLLM's does.")
    args = parser.parse_args()
    sock = listening(args.port)
    stub: ASGIApp = (garbage_app(args.garbage) if args.garbage
                     else build_app(args.delay, args.fail, args.served_model_name, args.version,
                                    args.record, args.pad))
    if args.api_key:
        stub = guarded(stub, args.api_key)
    # A garbage stub has nothing worth draining: without a bound, SIGTERM would wait for the
    # requests a "hang" stub holds (an hour).
    config = uvicorn.Config(stub, log_level="warning",
                            timeout_graceful_shutdown=1 if args.garbage else None)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
