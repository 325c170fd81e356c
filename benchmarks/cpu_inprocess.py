"""The gateway's own CPU per request, without sockets: a steadier figure than a wrk run on a
shared machine, for comparing two versions of the hot path.

The real protocol (`protocol_for`), app (`create_app`, lifespan included) and proxy serve
chat requests on C in-memory keep-alive connections; the replica hop is an in-memory connection
of the real upstream pool that answers every request with one recorded STUB answer. Two STUB
replicas run for admission only. Prints the CPU time per request (min and median of the bursts).
What it leaves out is the same for every version: syscalls, epoll, the kernel's TCP.

    .venv/bin/python benchmarks/cpu_inprocess.py
    PYTHONPATH=DIR .venv/bin/python benchmarks/cpu_inprocess.py     # DIR/grm_service instead

Instructions per request, whatever else the machine runs (valgrind, ~1 min), on the event
loop's thread (`-01`): counting every thread, two runs of one tree differed by up to 5 % (the
ledger writer's thread and the collector's timing move with the run), the loop's by <= 0.4 %:

    valgrind --tool=callgrind --separate-threads=yes --instr-atstart=no \\
        --callgrind-out-file=/tmp/cg.out .venv/bin/python benchmarks/cpu_inprocess.py --callgrind
    callgrind_annotate /tmp/cg.out-01 | grep 'PROGRAM TOTALS'     # divided by --requests

`--collector`: the cycle collector's passes and their CPU per request during the bursts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import os
import pstats
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
import uvloop
from harness import bodies, images, procs, servers
from harness.cpu import Counts, thread_counts
from harness.stub_server import logprobs_answer
from uvicorn.lifespan.on import LifespanOn
from uvicorn.server import ServerState

from grm_service.config import Settings
from grm_service.gateway.app import create_app
from grm_service.gateway.edge.hotpath import HotPath
from grm_service.gateway.edge.protocol_check import protocol_for
from grm_service.gateway.request.upstream import Upstream, _Connection, _Replica
from grm_service.gateway.service import Service

try:
    from grm_service.testing.reads import hand_on
except ImportError:  # an older tree (PYTHONPATH), whose protocol is never a buffered one
    def hand_on(transport: Any, data: bytes) -> None:
        transport.protocol.data_received(data)

_CHAT_ANSWER = (
    b'{"id":"chatcmpl-stub","object":"chat.completion","created":0,"model":"rm",'
    b'"choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":'
    b'{"role":"assistant","content":"stub-0123456789abcdef"}}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')


def _reply(answer: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 10:00:00 GMT\r\nserver: uvicorn\r\n"
            b"content-length: %d\r\ncontent-type: application/json\r\n\r\n" % len(answer)
            + answer)


def _http(body: bytes, i: int) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
            b"Content-Type: application/json\r\nX-Session-ID: k%d\r\nX-SMG-Routing-Key: k%d\r\n"
            b"Content-Length: %d\r\n\r\n" % (i, i, len(body)) + body)


def _chat_request(i: int) -> bytes:
    """What loadgen.lua sends."""
    return _http(b'{"model":"rm","messages":[{"role":"user","content":"score prompt %d"}],'
                 b'"seed":42,"max_tokens":8,"temperature":0}' % i, i)


def _ocr_request(i: int) -> bytes:
    """An OCR request on a 224 x 224 document crop of its own (PNG, ~114 KB): 128 tokens with
    logprobs, temperature 0.7, top_p 0.8."""
    png = images.scan_page(224, 224, 0.31, "RGB", seed=i)
    body = images.chat_body(png)
    body.update(max_tokens=128, logprobs=True, temperature=0.7, top_p=0.8, seed=42)
    return _http(json.dumps(body).encode(), i)


def _judge_request(i: int) -> bytes:
    """A short judge request: a prompt and a completion to grade, 8 tokens answered."""
    text = f"Grade the answer from 1 to 10. Question {i}: what is 17 * 3? Answer: 51."
    body = {"model": "rm", "messages": [{"role": "user", "content": text}], "seed": 42,
            "max_tokens": 8, "temperature": 0}
    return _http(json.dumps(body).encode(), i)


def _client_request(kind: str) -> Callable[[int], bytes]:
    """bench_gateway's `--body judge` or `--body sdk` requests (bodies.py), headers included."""
    made = bodies.requests(kind, "rm")

    def request(i: int) -> bytes:
        headers, body = made[i % len(made)]
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
        return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
                + lines.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    return request


def _scan_request(i: int) -> bytes:
    """A 1700 x 2200 grey page scan (PNG, ~2 MB; a 2.7 MB body), 16 tokens answered."""
    png = images.scan_page(1700, 2200, 0.025, seed=i)
    return _http(json.dumps(images.chat_body(png)).encode(), i)


# workload -> (requests, the replica's recorded answer, distinct requests)
WORKLOADS: dict[str, tuple[Callable[[int], bytes], Callable[[], bytes], int]] = {
    "chat": (_chat_request, lambda: _CHAT_ANSWER, 256),
    "judge": (_judge_request, lambda: _CHAT_ANSWER, 256),
    "ocr": (_ocr_request, lambda: logprobs_answer(128), 256),
    "scan": (_scan_request, lambda: _CHAT_ANSWER, 2),
    "judge-client": (_client_request("judge"), lambda: _CHAT_ANSWER, bodies.DISTINCT),
    "sdk": (_client_request("sdk"), lambda: _CHAT_ANSWER, bodies.DISTINCT),
}
# What one read from a socket gives the protocol at most (uvloop's read buffer).
READ_BYTES = 256 << 10


def _thread_cpu() -> dict[str, Counts]:
    """Each of this process's threads' /proc counters, by Python name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    used: dict[str, Counts] = {}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            name = names.get(int(task.name), f"tid {task.name}")
            used[name] = used.get(name, Counts()) + thread_counts(task)
    return used


class _Pipe:
    """A transport whose writes go to a callback on the next loop turn, and whose reads go to
    its protocol as a socket's transport hands them on (`hand_on`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_write: Any) -> None:
        self.loop, self.on_write, self.closing = loop, on_write, False
        self.protocol: Any = None

    def write(self, data: bytes) -> None:
        self.loop.call_soon(self.on_write, data)

    def writelines(self, parts: list[bytes]) -> None:
        # The callback sees the first part only: joining them would copy a large body, which
        # uvloop's writelines does not do (only the in-memory replica gets these).
        self.write(parts[0])

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

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

    reply = _reply(_CHAT_ANSWER)

    async def _connect(self, replica: _Replica) -> _Connection:
        loop = asyncio.get_running_loop()
        conn = _Connection(loop, self._deadlines)
        reply = self.reply
        conn.connection_made(_Pipe(loop, lambda _: conn.data_received(reply)))  # type: ignore[arg-type]
        self._open.add(conn)
        # Counted as the real pool counts it: a replica with no open connection is forgotten
        # after each request, and its idle connections with it.
        replica.open += 1
        return conn


class _Clients:
    """C closed-loop keep-alive clients sending `total` requests between them."""

    def __init__(self, make: Any, loop: asyncio.AbstractEventLoop, conns: int, total: int,
                 requests: list[list[bytes]]) -> None:
        self.total, self.left, self.done, self.bad = total, total, 0, 0
        self.finished: asyncio.Future[None] = loop.create_future()
        self.requests = requests
        self.pipes = [_Pipe(loop, lambda data, i=i: self._answered(i, data))
                      for i in range(conns)]
        for pipe in self.pipes:
            pipe.protocol = make()
            pipe.protocol.connection_made(pipe)
        for i in range(conns):
            self._send(i)

    def _send(self, i: int) -> None:
        if self.left > 0:
            self.left -= 1
            for piece in self.requests[(self.left + i) % len(self.requests)]:
                hand_on(self.pipes[i], piece)

    def _answered(self, i: int, data: bytes) -> None:
        self.bad += not data.startswith(b"HTTP/1.1 200")
        if self.pipes[i].closing and not self.finished.done():
            # A closed-loop client whose connection was closed would wait forever: say why.
            status = data.split(b"\r\n", 1)[0].decode(errors="replace")
            self.finished.set_exception(RuntimeError(
                f"the gateway closed a connection after '{status}': at this body size, "
                f"fewer --connections (GRM_MAX_BYTES_IN_FLIGHT bounds the bytes in flight)"))
            return
        self.done += 1
        if self.done == self.total:
            self.finished.set_result(None)
        self._send(i)


async def _run(args: argparse.Namespace, urls: list[str], work_dir: Path) -> None:
    # No health checks while measuring: the replica hop is in memory, and under valgrind a
    # check of the STUB replicas times out, marks them down, and the burst is answered 503. A
    # ledger of its own: two runs side by side (before, after) would lock each other's.
    settings = Settings(replica_urls=urls, served_model_name=procs.STUB_MODEL, serialize="off",
                        health_interval_s=3600.0,
                        work_dir=work_dir)
    _keep_freed_memory(settings)
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
    make_request, answer, distinct = WORKLOADS[args.workload]
    # Cut as the socket's reads would cut them, before the bursts: no copy is measured.
    requests = [[raw[at:at + READ_BYTES] for at in range(0, len(raw), READ_BYTES)]
                for raw in map(make_request, range(distinct))]
    upstream = _MemoryUpstream(settings.request_timeout_s)
    upstream.reply = _reply(answer())
    gw.client = upstream
    loop, state = asyncio.get_running_loop(), ServerState()

    async def burst(total: int) -> _Clients:
        clients = _Clients(lambda: protocol(config, state, {}, loop), loop, args.connections,
                           total, requests)
        await clients.finished
        return clients

    await burst(2000)  # warm-up: connections, caches, the stamp
    _settle_collector()
    if args.callgrind:
        pid = str(os.getpid())
        subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
        clients = await burst(args.requests)
        subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
        print(f"{clients.done} requests measured ({clients.bad} not 200)")
    elif args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        clients = await burst(args.requests)
        profiler.disable()
        stats = pstats.Stats(profiler)
        stats.dump_stats(args.profile)
        stats.sort_stats("tottime").print_stats(25)
        print(f"{clients.done} requests profiled ({clients.bad} not 200): {args.profile}")
    else:
        per: list[float] = []
        threads_before = _thread_cpu()
        passes = _Passes()
        if args.collector:
            gc.callbacks.append(passes.seen)
        for _ in range(args.bursts):
            start = time.process_time()
            clients = await burst(args.requests)
            per.append((time.process_time() - start) / clients.done * 1e6)
        if args.collector:
            gc.callbacks.remove(passes.seen)
            print(passes.report(args.bursts * args.requests))
        per.sort()
        print(f"gateway CPU per request: min {per[0]:.1f} us, median {per[len(per) // 2]:.1f} us"
              f" ({args.workload}, {args.bursts} bursts of {args.requests}, c={args.connections},"
              f" {clients.bad} not 200)")
        if args.threads:
            after, done = _thread_cpu(), args.bursts * args.requests
            for name, counts in after.items():
                d = counts - threads_before.get(name, Counts())
                user, system = d.utime / done * 1e6, d.stime / done * 1e6
                if user + system >= 0.05:
                    print(f"  thread {name}: {user:.1f} us user + {system:.1f} us system per"
                          f" request; per request {(d.vcsw + d.ivcsw) / done:.3f} context"
                          f" switches, {d.minflt / done:.3f} page faults")
    await lifespan.shutdown()


class _Passes:
    """The cycle collector's passes per generation and their CPU (`gc.callbacks`)."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.cpu = [0.0, 0.0, 0.0]
        self._start = 0.0

    def seen(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.process_time()
            return
        generation = info["generation"]
        self.count[generation] += 1
        self.cpu[generation] += time.process_time() - self._start

    def report(self, requests: int) -> str:
        per = " ".join(f"gen{g} {n} passes {t / requests * 1e6:.2f} us"
                       for g, (n, t) in enumerate(zip(self.count, self.cpu, strict=True)))
        return (f"cycle collector per request: {sum(self.cpu) / requests * 1e6:.2f} us"
                f" ({per}; {requests} requests)")


def _keep_freed_memory(settings: Settings) -> None:
    """What `serve` does to malloc before it serves (absent from an older tree: nothing)."""
    try:
        from grm_service.gateway.heap import keep_freed_memory
    except ImportError:
        return
    keep_freed_memory(settings.malloc_keep_bytes)


def _settle_collector() -> None:
    """What `serve` does to the cycle collector after start-up; an older tree (PYTHONPATH)
    without `settle_collector` froze the heap and left the thresholds."""
    try:
        from grm_service.gateway.heap import settle_collector
    except ImportError:
        gc.collect()
        gc.freeze()
        return
    settle_collector()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=None,
                        help="64; 1 for --workload scan (64 of its bodies pass the gateway's "
                        "bound on request bytes in flight, which refuses the rest)")
    parser.add_argument("--requests", type=int, default=8000, help="per burst")
    parser.add_argument("--bursts", type=int, default=6)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="chat",
                        help="chat: loadgen.lua's bodies; ocr: a distinct 224 x 224 PNG each, "
                        "128 tokens with logprobs answered; judge: a short grading prompt; "
                        "scan: a 2.7 MB page-scan body; judge-client and sdk: bench_gateway's "
                        "--body judge and --body sdk")
    parser.add_argument("--profile", type=Path, default=None, metavar="FILE",
                        help="one burst under cProfile: the top functions, stats to FILE")
    parser.add_argument("--callgrind", action="store_true",
                        help="one burst with valgrind's instrumentation on (run under callgrind)")
    parser.add_argument("--collector", action="store_true",
                        help="also the cycle collector's passes and their CPU per request")
    parser.add_argument("--threads", action="store_true",
                        help="also the CPU per request of each thread (the loop, the ledger's)")
    args = parser.parse_args()
    if args.connections is None:
        args.connections = 1 if args.workload == "scan" else 64
    with procs.fleet() as f, tempfile.TemporaryDirectory(prefix="grm-inprocess-") as work:
        stubs = [servers.start_stub(f, i) for i in range(2)]
        uvloop.run(_run(args, [s.url for s in stubs], Path(work)))


if __name__ == "__main__":
    main()
