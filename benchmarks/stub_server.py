"""Serve the project's STUB backend (`grm_service.testing.stub_openai.build_app`) for benchmarks.

Why not `python -m grm_service.testing.stub_openai`: that runs on the stock asyncio loop; this
runs the same app on uvicorn's loop factory (uvloop), as `uvicorn.run` would, so the stub is never
the slow side. (Both bind with IPPROTO_TCP: asyncio and uvloop set TCP_NODELAY on accepted
sockets only then; without it each keep-alive reply waited ~40 ms for a delayed ACK.)

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
