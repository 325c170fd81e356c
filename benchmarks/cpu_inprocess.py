"""The gateway's own CPU per request, without sockets: a steadier figure than a wrk run on a
shared machine, for comparing two versions of the hot path.

The real protocol (`protocol_for`), app (`create_app`, lifespan included) and proxy serve
chat requests on C in-memory keep-alive connections; the replica hop is an in-memory connection
of the real upstream pool that answers every request with one recorded STUB answer. Two STUB
replicas run for admission only. Prints the CPU time per request (min and median of the bursts).
What it leaves out is the same for every version: syscalls, epoll, the kernel's TCP.

    .venv/bin/python benchmarks/cpu_inprocess.py
    PYTHONPATH=DIR .venv/bin/python benchmarks/cpu_inprocess.py     # DIR/grm_service instead

Instructions per request, deterministic whatever else the machine runs (valgrind, ~1 min):

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/cg.out \\
        .venv/bin/python benchmarks/cpu_inprocess.py --callgrind
    callgrind_annotate /tmp/cg.out | grep 'PROGRAM TOTALS'     # divided by --requests
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import uvicorn
import uvloop
from uvicorn.lifespan.on import LifespanOn
from uvicorn.server import ServerState

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs

from grm_service.config import Settings
from grm_service.gateway.app import create_app
from grm_service.gateway.edge.hotpath import HotPath
from grm_service.gateway.edge.protocol_check import protocol_for
from grm_service.gateway.request.upstream import Upstream, _Connection, _Target
from grm_service.gateway.service import Service

_ANSWER = (b'{"id":"chatcmpl-stub","object":"chat.completion","created":0,"model":"rm",'
           b'"choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":'
           b'{"role":"assistant","content":"stub-0123456789abcdef"}}],'
           b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')
_REPLY = (b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 10:00:00 GMT\r\nserver: uvicorn\r\n"
          b"content-length: %d\r\ncontent-type: application/json\r\n\r\n" % len(_ANSWER)
          + _ANSWER)


def _request(i: int) -> bytes:
    """What benchmarks/loadgen.lua sends."""
    body = (b'{"model":"rm","messages":[{"role":"user","content":"score prompt %d"}],'
            b'"seed":42,"max_tokens":8,"temperature":0}' % i)
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
            b"Content-Type: application/json\r\nX-Session-ID: k%d\r\nX-SMG-Routing-Key: k%d\r\n"
            b"Content-Length: %d\r\n\r\n" % (i, i, len(body)) + body)


class _Pipe:
    """A transport whose writes go to a callback on the next loop turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_write: Any) -> None:
        self.loop, self.on_write, self.closing = loop, on_write, False

    def write(self, data: bytes) -> None:
        self.loop.call_soon(self.on_write, data)

    def writelines(self, parts: list[bytes]) -> None:
        self.write(b"".join(parts))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(name)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    abort = close

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class _MemoryUpstream(Upstream):
    """The real pool and connection protocol; each connection's replica is a recording."""

    async def _connect(self, target: _Target) -> _Connection:
        loop = asyncio.get_running_loop()
        conn = _Connection(loop)
        conn.connection_made(_Pipe(loop, lambda _: conn.data_received(_REPLY)))  # type: ignore[arg-type]
        self._open.add(conn)
        return conn


class _Clients:
    """C closed-loop keep-alive clients sending `total` requests between them."""

    def __init__(self, make: Any, loop: asyncio.AbstractEventLoop, conns: int, total: int) -> None:
        self.total, self.left, self.done, self.bad = total, total, 0, 0
        self.finished: asyncio.Future[None] = loop.create_future()
        self.requests = [_request(i) for i in range(256)]
        self.protos = [make() for _ in range(conns)]
        for i, proto in enumerate(self.protos):
            proto.connection_made(_Pipe(loop, lambda data, i=i: self._answered(i, data)))
        for i in range(conns):
            self._send(i)

    def _send(self, i: int) -> None:
        if self.left > 0:
            self.left -= 1
            self.protos[i].data_received(self.requests[(self.left + i) % 256])

    def _answered(self, i: int, data: bytes) -> None:
        self.bad += not data.startswith(b"HTTP/1.1 200")
        self.done += 1
        if self.done == self.total:
            self.finished.set_result(None)
        self._send(i)


async def _run(args: argparse.Namespace, urls: list[str]) -> None:
    settings = Settings(backend_urls=urls, served_model_name=procs.STUB_MODEL, serialize="off")
    service = Service(settings)
    app = create_app(service)
    protocol = protocol_for(service)
    config = uvicorn.Config(app, lifespan="on", http=protocol, access_log=False,
                            log_level="warning", proxy_headers=False, ws="none")
    config.load()
    lifespan = LifespanOn(config)
    await lifespan.startup()
    assert isinstance(app, HotPath)
    gw = service.gateway  # set by the lifespan
    assert gw is not None
    while len(gw.pool.ready()) < len(urls):
        await asyncio.sleep(0.2)
    gw.client = _MemoryUpstream(settings.request_timeout_s)
    loop, state = asyncio.get_running_loop(), ServerState()

    async def burst(total: int) -> _Clients:
        clients = _Clients(lambda: protocol(config, state, {}, loop), loop, args.connections,
                           total)
        await clients.finished
        return clients

    await burst(2000)  # warm-up: connections, caches, the stamp
    gc.collect()
    gc.freeze()  # as `serve` does after start-up
    if args.callgrind:
        pid = str(os.getpid())
        subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
        clients = await burst(args.requests)
        subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
        print(f"{clients.done} requests measured ({clients.bad} not 200)")
    else:
        per: list[float] = []
        for _ in range(args.bursts):
            start = time.process_time()
            clients = await burst(args.requests)
            per.append((time.process_time() - start) / clients.done * 1e6)
        per.sort()
        print(f"gateway CPU per request: min {per[0]:.1f} us, median {per[len(per) // 2]:.1f} us"
              f" ({args.bursts} bursts of {args.requests}, c={args.connections},"
              f" {clients.bad} not 200)")
    await lifespan.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--requests", type=int, default=8000, help="per burst")
    parser.add_argument("--bursts", type=int, default=6)
    parser.add_argument("--callgrind", action="store_true",
                        help="one burst with valgrind's instrumentation on (run under callgrind)")
    args = parser.parse_args()
    with procs.fleet() as f:
        stubs = [procs.start_stub(f, i) for i in range(2)]
        uvloop.run(_run(args, [s.url for s in stubs]))


if __name__ == "__main__":
    main()
