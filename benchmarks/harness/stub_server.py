"""Serve the project's STUB backend (`grm_service.testing.stub_openai.build_app`) for benchmarks.

Why not `python -m grm_service.testing.stub_openai`: that runs on the stock asyncio loop; this
runs the same app on uvicorn's loop factory (uvloop), as `uvicorn.run` would, so the stub is never
the slow side. (Both bind with IPPROTO_TCP: asyncio and uvloop set TCP_NODELAY on accepted
sockets only then; without it each keep-alive reply waited ~40 ms for a delayed ACK.)

`--fast`: `POST /v1/chat/completions` and `POST /classify` are answered by the protocol itself,
with the app's bytes (`FastStubProtocol`), and every other request goes to the app. Where many
gateway workers share a machine with the stubs (benchmarks/gpu), the app's per-request cost
(~100 us of Starlette and ASGI) took cores the gateway's scaling was to be measured on.

`--logprobs N` (with `--fast`): every chat answer is one OCR answer of N tokens with logprobs
(`logprobs_answer`), the size and shape of what a VL replica sends back for goal 2's workload.

    python benchmarks/harness/stub_server.py --port 0 [--delay S] [--fast [--logprobs N]]

It prints `PORT n` once it listens.
"""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from grm_service.gateway.request.answer import RESPONSE_JSON
from grm_service.testing.stub_openai import CLASSIFY_ANSWER, build_app, completion, listening

_FAST_PATHS = (b"/v1/chat/completions", b"/classify")


def logprobs_answer(tokens: int) -> bytes:
    """An OCR answer as vLLM renders it (starlette's compact JSON of its response model):
    `tokens` tokens with logprobs, most of them confident (logprobs near 0, as OCR gives)."""
    rng = random.Random(0)
    words = ["Invoice", " total", " 12", ".", "50", " EUR", " paid", " on", " 2026", "-11"]
    content = []
    for _ in range(tokens):
        token = rng.choice(words)
        logprob = -rng.expovariate(1.0) * (1e-4 if rng.random() < 0.7 else 1.0)
        content.append({"token": token, "logprob": logprob, "bytes": list(token.encode()),
                        "top_logprobs": []})
    message = {"role": "assistant", "content": "".join(c["token"] for c in content),
               "refusal": None, "annotations": None, "audio": None, "function_call": None,
               "tool_calls": [], "reasoning": None}
    answer = {"id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": "rm",
              "choices": [{"index": 0, "message": message, "logprobs": {"content": content},
                           "finish_reason": "length", "stop_reason": None,
                           "token_ids": None}],
              "service_tier": None, "system_fingerprint": None,
              "usage": {"prompt_tokens": 300, "total_tokens": 300 + tokens,
                        "completion_tokens": tokens, "prompt_tokens_details": None},
              "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None}
    return json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode()


class FastStubProtocol(HttpToolsProtocol):
    """uvicorn's protocol, answering the two engine routes without the app. Set `delay` on a
    subclass. Benchmark code: it leans on uvicorn's private protocol (its version is the
    project's pin)."""

    delay = 0.0
    answer: bytes | None = None  # the chat answer's bytes, where set (`--logprobs`)
    _fast: bytes | None = None

    def on_headers_complete(self) -> None:
        url = self.url.split(b"?", 1)[0]
        idle = self.cycle is None or self.cycle.response_complete
        if url in _FAST_PATHS and self.parser.get_method() == b"POST" and idle:
            self._fast, self._chunks = url, []
            return
        self._fast = None
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._fast is None:
            super().on_body(body)
        else:
            self._chunks.append(body)

    def on_message_complete(self) -> None:
        if self._fast is None:
            super().on_message_complete()
            return
        raw = b"".join(self._chunks)
        chat = self._fast == _FAST_PATHS[0]
        if chat and self.answer is not None:
            content = self.answer
        else:
            content = RESPONSE_JSON.encode(completion(json.loads(raw), raw) if chat
                                           else CLASSIFY_ANSWER).encode()
        keep = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        head = [b"HTTP/1.1 200 OK\r\n"]
        head += [b"%s: %s\r\n" % pair for pair in self.server_state.default_headers]
        head.append(b"content-length: %d\r\ncontent-type: application/json\r\n" % len(content))
        if not keep:
            head.append(b"connection: close\r\n")
        data = b"".join(head) + b"\r\n" + content
        self._fast = None
        if self.delay:
            self.loop.call_later(self.delay, self._send, data, keep)
        else:
            self._send(data, keep)

    def _send(self, data: bytes, keep: bool) -> None:
        if self.transport.is_closing():
            return
        self.transport.write(data)
        if keep:
            self.on_response_complete()
        else:
            self.transport.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--fast", action="store_true",
                        help="answer the engine routes in the protocol (module doc)")
    parser.add_argument("--logprobs", type=int, default=None, metavar="N",
                        help="with --fast: answer every chat request with N tokens of logprobs")
    args = parser.parse_args()
    if args.logprobs is not None and not args.fast:
        parser.error("--logprobs needs --fast")
    sock = listening(args.port)
    answer = None if args.logprobs is None else logprobs_answer(args.logprobs)
    http: Any = (type("Fast", (FastStubProtocol,), {"delay": args.delay, "answer": answer})
                 if args.fast else "auto")
    config = uvicorn.Config(build_app(delay_s=args.delay), log_level="warning", http=http)
    # Server.run picks uvicorn's loop factory (uvloop when installed); asyncio.run would not.
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
