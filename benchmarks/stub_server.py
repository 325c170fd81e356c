"""Serve the project's STUB backend (`grm_service.testing.stub_openai.build_app`) for benchmarks.

Why not `python -m grm_service.testing.stub_openai`: its `main()` binds
`socket.socket(AF_INET, SOCK_STREAM)` (proto 0) and hands it to uvicorn. asyncio and uvloop only
set TCP_NODELAY on accepted sockets whose proto is IPPROTO_TCP, so the stub answers each
keep-alive POST in two segments with Nagle on, and the client's delayed ACK adds ~40 ms to every
request after the first (22 req/s at concurrency 1). Same app, bound with IPPROTO_TCP here,
and run on uvicorn's own loop factory (uvloop), as `uvicorn.run` would.

    python benchmarks/stub_server.py --port 0 [--delay S]   # prints PORT n
"""

from __future__ import annotations

import argparse
import socket
import sys

import uvicorn

from grm_service.testing.stub_openai import build_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sys.stdout.write(f"PORT {sock.getsockname()[1]}\n")
    sys.stdout.flush()
    config = uvicorn.Config(build_app(delay_s=args.delay), log_level="warning")
    # Server.run picks uvicorn's loop factory (uvloop when installed); asyncio.run would not.
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
