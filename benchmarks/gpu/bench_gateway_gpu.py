"""The gateway's cost on a real GPU replica: direct vs through grm-service, same replica, same run.

Starts `grm-service serve --engine vllm` for a Qwen2-VL model (one deterministic replica: batch
invariance, the vLLM plugin, the canary) and, with `--cls`, a second one for a sequence classifier
plus a gateway attached to that classifier with `--serialize on` (how every /classify ran before
pooling could be co-batched). Then, 4 interleaved rounds each (order alternated, medians):

  ocr    256 concurrent OCR requests (224x224 PNG, ~114 KB body) x 128 tokens
  judge  1,024 short judge requests x 4 tokens, 256 in flight
  token  per-token latency, one request at a time x 128 tokens, direct and gateway alternating
  cls    /classify: 64 texts alone / all at once / shuffled among 192 others / serialized
         gateway / direct (bitwise), and 512 requests at 256 in flight (throughput)

Gateway CPU per request is the gateway process's own utime+stime (its replica is a child and is
not counted). Writes one JSON (--out) and prints the tables.

`--attach-variant NAME=DIR` (repeatable) adds a gateway attached to the VL replica, run from
the `grm_service` package in DIR (empty: this tree), as one more path of the ocr, judge and
token rounds: two versions of the gateway on one replica in the same rounds. A round's CPU per
request follows how many answers the replica hands back together, so versions compare only
within a round.

    python3 benchmarks/gpu/bench_gateway_gpu.py --vl /tmp/models/vl --cls /tmp/models/cls \
        --out $OUT/gpu-gateway.json
    python3 benchmarks/gpu/bench_gateway_gpu.py --vl /tmp/models/vl --ocr-images 256 --logprobs \
        --attach-variant now= --attach-variant before=DIR --out $OUT/gpu-gateway-ab.json
    python3 benchmarks/gpu/bench_gateway_gpu.py --stub --out /tmp/gpu-dry.json   # CPU dry run

The dry run with `--stub-delay 4 --stub-logprobs 128 --ocr-images 256 --logprobs` stands in
for the OCR workload's shape on CPU: the same bodies, answers of the same size, and about the
replica's rate (256 in flight for ~4 s: ~60 req/s), so that a gateway's CPU per request at that
low rate, and two trees' (`--attach-variant`), can be compared without a GPU.

Where that CPU goes: `--profile NAME` records the gateway of path NAME (an `--attach-variant`
kept for it, so the figures compared are not a sampled process's) with py-spy through the OCR
rounds, C frames included (`--py-spy PATH`; the process pauses for each sample): raw stacks of
each round to `profile-NAME-rR.txt` beside `--out`, read by `profile_gateway.py --summarize
FILE... --native`.
`--keep-answers N` writes N of the replica's own OCR answers, the bytes it sent, to
`answers.jsonl` beside `--out` (one JSON string per line), for the 2-core machine's benches.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import aiohttp

HERE = Path(__file__).resolve().parent
LOGS = Path(os.environ.get("GRM_GPU_LOG_DIR", "/tmp/grm-gpu-gw"))
TICKS = os.sysconf("SC_CLK_TCK")


# ---- processes ------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _workers_of(pid: int) -> list[int]:
    """The worker processes of `serve --workers N` under `pid` (not its replicas' processes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int(_stat(int(entry.name))[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid and b"grm_service.workers.worker" in cmdline:
            found.append(int(entry.name))
    return found


def cpu_s(pid: int) -> float:
    """utime+stime of the gateway: its process and, with --workers N, its worker processes."""
    total = 0.0
    for one in [pid, *_workers_of(pid)]:
        with contextlib.suppress(OSError):
            fields = _stat(one)
            total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    url: str

    def tail(self, n: int = 40) -> str:
        lines = (LOGS / f"{self.name}.log").read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


@contextlib.contextmanager
def processes() -> Iterator[list[Proc]]:
    procs: list[Proc] = []
    try:
        yield procs
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.popen.wait(40)
            except subprocess.TimeoutExpired:
                os.killpg(p.popen.pid, signal.SIGKILL)


def spawn(procs: list[Proc], name: str, argv: list[str], port: int,
          env: dict[str, str] | None = None) -> Proc:
    LOGS.mkdir(parents=True, exist_ok=True)
    with (LOGS / f"{name}.log").open("wb") as log:
        # cwd outside any checkout: `python -m` puts cwd first on sys.path, where another
        # grm_service would shadow the one on PYTHONPATH.
        popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=LOGS,
                                 stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    proc = Proc(name, popen, f"http://127.0.0.1:{port}")
    procs.append(proc)
    return proc


def gateway(procs: list[Proc], name: str, args: list[str], engine_args: list[str],
            workers: int = 1, tree: str = "") -> Proc:
    """`tree`: a folder holding another grm_service package, run instead of this one."""
    port = free_port()
    argv = [sys.executable, "-m", "grm_service.cli", "serve", "--port", str(port),
            "--work-dir", str(LOGS / f"work-{name}"), "--log-level", "info",
            "--workers", str(workers), *args]
    env = None
    if tree:
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")])}
    return spawn(procs, name, argv + (["--", *engine_args] if engine_args else []), port, env)


def attached(procs: list[Proc], vl: Proc, model: str, variants: list[str],
             workers: int, extra: list[str]) -> list[Proc]:
    """One gateway per NAME=DIR variant (DIR empty: this tree), each attached to `vl`'s
    replica: two versions of the gateway in the same rounds, on the same replica; `extra`:
    more arguments of `serve`."""
    out = []
    for variant in variants:
        name, _, tree = variant.partition("=")
        out.append(gateway(procs, f"gw-{name}", ["--replica-url", replica_url(vl),
                                                 "--served-model-name", model, *extra], [],
                           workers,
                           str(Path(tree).resolve()) if tree else ""))
    return out


def get_json(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")
    except (OSError, ValueError):
        return 0, None


def wait_ready(procs: list[Proc], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(procs)
    while pending and time.monotonic() < deadline:
        for p in list(pending):
            if p.popen.poll() is not None:
                raise RuntimeError(f"{p.name} exited:\n{p.tail()}")
            status, body = get_json(p.url + "/ready")
            states = {r["state"] for r in (body or {}).get("replicas", [])}
            if status == 200 and states <= {"ready"}:
                print(f"{p.name} ready after {time.monotonic() - START:.0f} s", flush=True)
                pending.remove(p)
        time.sleep(1)
    if pending:
        raise RuntimeError(f"not ready in {timeout:.0f} s: {pending[0].name}\n{pending[0].tail()}")


def replica_url(gw: Proc) -> str:
    return str(get_json(gw.url + "/ready")[1]["replicas"][0]["url"])


# ---- requests -------------------------------------------------------------------------------

def ocr_image(index: int) -> str:
    """224x224 PNG: three lines of text on a noisy page (noise keeps PNG from compressing it to
    nothing, as a scan's grain does): ~80 KB, ~110 KB as base64 in the body."""
    from PIL import Image, ImageDraw

    rng = random.Random(index)
    img = Image.frombytes("L", (224, 224), bytes(rng.randrange(200, 256) for _ in range(224 * 224)))
    img = img.convert("RGB")
    draw = ImageDraw.Draw(img)
    for line in range(3):
        draw.text((10, 40 + 50 * line), f"Invoice {index}-{line}: {rng.randrange(10**6)}",
                  fill=(0, 0, 0))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def ocr_bodies(model: str, n: int, images: int = 16,
               logprobs: bool = False) -> list[dict[str, Any]]:
    """`n` OCR requests over `images` distinct images; `logprobs`: each token's logprob too."""
    urls = [ocr_image(i) for i in range(images)]
    extra: dict[str, Any] = {"logprobs": True} if logprobs else {}
    return [{"model": model, "seed": 1000 + i, "temperature": 0.7, "top_p": 0.8,
             "max_tokens": 128, "ignore_eos": True, **extra,
             "messages": [{"role": "user", "content": [
                 {"type": "image_url", "image_url": {"url": urls[i % images]}},
                 {"type": "text", "text": "Transcribe the text in this image."}]}]}
            for i in range(n)]


def judge_bodies(model: str, n: int, tokens: int) -> list[dict[str, Any]]:
    return [{"model": model, "seed": 5000 + i, "temperature": 0.7, "top_p": 0.8,
             "max_tokens": tokens, "ignore_eos": True,
             "messages": [{"role": "user", "content": f"Question {i}: is answer {i * 7 % 13} "
                           "correct? Reply yes or no."}]}
            for i in range(n)]


def cls_texts(n: int, tag: str) -> list[str]:
    return [f"{tag} {i}: " + " ".join(f"w{(i * 13 + j) % 89}" for j in range(8 + (i * 37) % 200))
            for i in range(n)]


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(url, json=body) as r:
        payload: dict[str, Any] = await r.json(content_type=None)
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}: {str(payload)[:300]}")
        return payload


async def fan_out(session: aiohttp.ClientSession, url: str, bodies: list[dict[str, Any]],
                  in_flight: int) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(in_flight)

    async def one(body: dict[str, Any]) -> dict[str, Any]:
        async with gate:
            return await post(session, url, body)

    return list(await asyncio.gather(*(one(b) for b in bodies)))


@dataclass
class Target:
    name: str
    url: str  # base URL
    pid: int | None  # gateway pid whose CPU is counted


async def timed(session: aiohttp.ClientSession, target: Target, route: str,
                bodies: list[dict[str, Any]], in_flight: int) -> dict[str, float]:
    cpu0 = cpu_s(target.pid) if target.pid else 0.0
    t0 = time.perf_counter()
    await fan_out(session, target.url + route, bodies, in_flight)
    seconds = time.perf_counter() - t0
    cpu = (cpu_s(target.pid) - cpu0) if target.pid else 0.0
    return {"seconds": seconds, "rps": len(bodies) / seconds,
            "cpu_ms_per_req": cpu / len(bodies) * 1e3}


async def rounds(session: aiohttp.ClientSession, paths: list[Target], route: str,
                 bodies: list[dict[str, Any]], in_flight: int, n: int,
                 spy: Spy | None = None) -> dict[str, list[Any]]:
    """`spy`: py-spy on its path's gateway during that path's rounds."""
    out: dict[str, list[Any]] = {p.name: [] for p in paths}
    for rnd in range(n):
        for p in (paths if rnd % 2 == 0 else paths[::-1]):
            with spy.on(p, rnd) if spy is not None else contextlib.nullcontext():
                res = await timed(session, p, route, bodies, in_flight)
            out[p.name].append(res)
            print(f"  round {rnd} {p.name:<10} {res['rps']:8.1f} req/s  "
                  f"{res['cpu_ms_per_req']:.2f} ms CPU/req", flush=True)
    return out


async def token_latency(session: aiohttp.ClientSession, paths: list[Target], model: str,
                        n: int, tokens: int) -> dict[str, list[float]]:
    bodies = judge_bodies(model, n, tokens)
    out: dict[str, list[float]] = {p.name: [] for p in paths}
    for i, body in enumerate(bodies):
        for p in (paths if i % 2 == 0 else paths[::-1]):
            t0 = time.perf_counter()
            await post(session, p.url + "/v1/chat/completions", body)
            out[p.name].append((time.perf_counter() - t0) / tokens * 1e3)
    return out


# ---- classify (pooling) ---------------------------------------------------------------------

def probs(payload: dict[str, Any]) -> str:
    return json.dumps([d.get("probs") for d in payload["data"]])


async def classify_checks(session: aiohttp.ClientSession, batched: Target, serial: Target,
                          direct: Target, model: str) -> dict[str, Any]:
    texts = cls_texts(64, "text")
    bodies = [{"model": model, "input": t} for t in texts]
    filler = [{"model": model, "input": t} for t in cls_texts(192, "filler")]
    route = "/classify"
    alone = [probs(await post(session, batched.url + route, b)) for b in bodies]
    at_once = [probs(p) for p in await fan_out(session, batched.url + route, bodies, 64)]
    mixed_bodies = bodies + filler
    order = list(range(len(mixed_bodies)))
    random.Random(7).shuffle(order)
    mixed_out = await fan_out(session, batched.url + route, [mixed_bodies[i] for i in order], 256)
    by_index = {i: probs(p) for i, p in zip(order, mixed_out, strict=True)}
    mixed = [by_index[i] for i in range(len(bodies))]
    one_list = await post(session, direct.url + route, {"model": model, "input": texts})
    as_list = [json.dumps([d["probs"]]) for d in one_list["data"]]
    serial_out = [probs(p) for p in await fan_out(session, serial.url + route, bodies, 64)]
    direct_out = [probs(p) for p in await fan_out(session, direct.url + route, bodies, 64)]
    sample = await post(session, batched.url + route, bodies[0])
    diff = {name: sum(a != b for a, b in zip(alone, got, strict=True))
            for name, got in [("at_once", at_once), ("shuffled_in_256", mixed),
                              ("one_list_request_direct", as_list),
                              ("serialized_gateway", serial_out),
                              ("direct_at_once", direct_out)]}
    print(f"  classify: of 64, differing from alone: {diff}", flush=True)
    return {"differ_of_64": diff, "fingerprint_serialized": sample["grm_fingerprint"]["serialized"]}


# ---- main -----------------------------------------------------------------------------------

def med(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def table(title: str, res: dict[str, list[dict[str, float]]], base: str) -> str:
    lines = [f"\n{title}", "| path | req/s median [min-max] | x " + base +
             " | gateway CPU ms/req median |", "|---|---|---|---|"]
    for name, runs in res.items():
        rps = [r["rps"] for r in runs]
        lines.append(f"| {name} | {statistics.median(rps):.1f} [{min(rps):.1f}-{max(rps):.1f}] "
                     f"| {med(runs, 'rps') / med(res[base], 'rps'):.3f} "
                     f"| {med(runs, 'cpu_ms_per_req'):.2f} |")
    return "\n".join(lines)


START = time.monotonic()


async def measure(args: argparse.Namespace, vl: Proc | None, cls: tuple[Proc, Proc] | None,
                  vl_model: str, more: list[Proc]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    # Idle connections are closed before the servers' own 5 s keep-alive timeout would: a POST
    # on a connection the server is closing fails, and aiohttp does not resend a POST.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=1.0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if vl is not None:
            await measure_vl(args, session, vl, vl_model, result, more)
        if cls is not None:
            await measure_cls(args, session, cls, result)
    return result


async def measure_vl(args: argparse.Namespace, session: aiohttp.ClientSession, vl: Proc,
                     vl_model: str, result: dict[str, Any], more: list[Proc]) -> None:
    paths = [Target("direct", replica_url(vl), None), Target("gateway", vl.url, vl.popen.pid),
             *(Target(p.name.removeprefix("gw-"), p.url, p.popen.pid) for p in more)]
    chat = "/v1/chat/completions"
    ocr = ocr_bodies(vl_model, args.ocr, args.ocr_images, args.logprobs)
    result["ocr_body_bytes"] = len(json.dumps(ocr[0]))
    print(f"OCR body {result['ocr_body_bytes']} bytes; warm-up", flush=True)
    for p in paths:
        await fan_out(session, p.url + chat, ocr[:32], 32)
        await fan_out(session, p.url + chat, judge_bodies(vl_model, 64, 4), 64)
        if p.name != "direct":  # the gateways in the same rounds must serialize alike
            answer = await post(session, p.url + chat, judge_bodies(vl_model, 1, 4)[0])
            serialized = answer["grm_fingerprint"]["serialized"]
            result.setdefault("serialized", {})[p.name] = serialized
            print(f"  {p.name}: serialized={serialized}", flush=True)
    if args.keep_answers:
        await keep_answers(session, paths[0].url + chat, ocr[:args.keep_answers],
                           args.out.parent / "answers.jsonl")
    print(f"ocr: {args.ocr} concurrent x 128 tokens", flush=True)
    spy = Spy(args.profile, args.py_spy, args.out.parent) if args.profile else None
    result["ocr"] = await rounds(session, paths, chat, ocr, args.ocr, args.rounds, spy)
    print(f"judge: {args.judge} requests x 4 tokens, 256 in flight", flush=True)
    judge = judge_bodies(vl_model, args.judge, 4)
    result["judge"] = await rounds(session, paths, chat, judge, 256, args.rounds)
    print("token latency: one at a time x 128 tokens", flush=True)
    result["token_ms"] = await token_latency(session, paths, vl_model, args.token_requests,
                                             128)


async def keep_answers(session: aiohttp.ClientSession, url: str, bodies: list[dict[str, Any]],
                       out: Path) -> None:
    """The replica's answers to `bodies` as the bytes it sent, one JSON string a line."""
    with out.open("w") as f:
        for body in bodies:
            async with session.post(url, json=body) as r:
                f.write(json.dumps((await r.read()).decode()) + "\n")
    print(f"kept {len(bodies)} answers in {out}", flush=True)


@dataclass
class Spy:
    """py-spy, C frames included, on path `name`'s gateway while that path's rounds run (not
    between them, when the gateway only waits): one raw file a round,
    `profile-NAME-rR.txt` in `out`."""

    name: str
    py_spy: str
    out: Path

    def _start(self, pid: int, raw: Path, log: IO[bytes], mode: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([self.py_spy, "record", "-p", str(pid), "-r", "100", "-f", "raw",
                                 "-o", str(raw), mode], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    @contextlib.contextmanager
    def on(self, target: Target, rnd: int) -> Iterator[None]:
        if target.name != self.name or target.pid is None:
            yield
            return
        raw = self.out / f"profile-{self.name}-r{rnd}.txt"
        with (LOGS / "py-spy.log").open("ab") as log:
            spy = self._start(target.pid, raw, log, "--native")
            time.sleep(0.5)  # attached before the round's first request
            if spy.poll() is not None:  # no C stacks here (ptrace, symbols): Python's alone
                spy = self._start(target.pid, raw, log, "--nonblocking")
                time.sleep(0.5)
            try:
                yield
            finally:
                spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
                try:
                    spy.wait(60)
                except subprocess.TimeoutExpired:
                    spy.kill()
        print(f"  py-spy {spy.args[-1]} exit {spy.returncode}: {raw.name} "
              f"({raw.stat().st_size if raw.exists() else 0} bytes)", flush=True)


async def measure_cls(args: argparse.Namespace, session: aiohttp.ClientSession,
                      cls: tuple[Proc, Proc], result: dict[str, Any]) -> None:
    batched_gw, serial_gw = cls
    cpaths = [Target("co-batched", batched_gw.url, batched_gw.popen.pid),
              Target("serialized", serial_gw.url, serial_gw.popen.pid),
              Target("direct", replica_url(batched_gw), None)]
    print("classify: bitwise checks", flush=True)
    result["cls_bitwise"] = await classify_checks(session, *cpaths[:2], cpaths[2], "cls")
    bodies = [{"model": "cls", "input": t} for t in cls_texts(args.cls_n, "load")]
    print(f"classify: {args.cls_n} requests, 256 in flight", flush=True)
    result["cls"] = await rounds(session, cpaths, "/classify", bodies, 256,
                                 args.cls_rounds)


def report(result: dict[str, Any], judge_n: int) -> str:
    out = []
    if "ocr" in result:
        out += [table("OCR, 256 concurrent x 128 tokens", result["ocr"], "direct"),
                table(f"judge, {judge_n:,} x 4 tokens, 256 in flight", result["judge"],
                      "direct"),
                "\nper-token latency, one request at a time (ms/token)",
                "| path | median | p90 |", "|---|---|---|"]
        for name, xs in result["token_ms"].items():
            xs = sorted(xs)
            p90 = xs[int(0.9 * (len(xs) - 1))]
            out.append(f"| {name} | {statistics.median(xs):.3f} | {p90:.3f} |")
    if "cls" in result:
        out.append(table("classify, 256 in flight", result["cls"], "serialized"))
        out.append(f"\nclassify bitwise: {json.dumps(result['cls_bitwise'])}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vl", default="/tmp/models/vl")
    parser.add_argument("--cls", default="", help="classifier model folder (goal: pooling)")
    parser.add_argument("--mem", default="0.40", help="GPU memory share of the VL replica")
    parser.add_argument("--cls-mem", default="0.20")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--ocr", type=int, default=256)
    parser.add_argument("--ocr-images", type=int, default=16,
                        help="distinct images among the OCR requests (256: one each)")
    parser.add_argument("--logprobs", action="store_true", help="OCR answers carry logprobs")
    parser.add_argument("--judge", type=int, default=1024)
    parser.add_argument("--token-requests", type=int, default=8)
    parser.add_argument("--cls-n", type=int, default=512)
    parser.add_argument("--cls-rounds", type=int, default=3)
    parser.add_argument("--ready-timeout", type=float, default=420)
    parser.add_argument("--stub", action="store_true", help="dry run on CPU stub replicas")
    parser.add_argument("--stub-delay", type=float, default=0.0, metavar="S",
                        help="with --stub: the stub answers S seconds after each request")
    parser.add_argument("--stub-logprobs", type=int, default=None, metavar="N",
                        help="with --stub: every chat answer holds N tokens with logprobs")
    parser.add_argument("--gateway-workers", type=int, default=1,
                        help="gateway processes on the port (serve --workers N)")
    parser.add_argument("--attach-variant", action="append", default=[], metavar="NAME=DIR",
                        help="another gateway attached to the VL replica, in the same rounds: "
                        "DIR holds its grm_service package (empty: this tree)")
    parser.add_argument("--profile", default="", metavar="NAME",
                        help="py-spy the gateway of path NAME through the OCR rounds")
    parser.add_argument("--py-spy", default=shutil.which("py-spy")
                        or str(Path(sys.executable).parent / "py-spy"))
    parser.add_argument("--keep-answers", type=int, default=0, metavar="N",
                        help="write N of the replica's OCR answers beside --out")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    unproven = ["--serialize", "off"] if args.stub else []
    with processes() as procs:
        if args.stub:
            port = free_port()
            shape = (["--fast", "--delay", str(args.stub_delay)]
                     + ([] if args.stub_logprobs is None
                        else ["--logprobs", str(args.stub_logprobs)]))
            stub_server = HERE.parent / "harness" / "stub_server.py"
            stub = spawn(procs, "stub", [sys.executable, str(stub_server), "--port", str(port),
                                         *shape], port)
            time.sleep(2)
            # A stub proves no batch invariance: the gateway would serialize it.
            vl = gateway(procs, "gw-vl", ["--replica-url", stub.url, "--served-model-name",
                                          "rm", *unproven], [], args.gateway_workers)
            model, cls = "rm", None
        else:
            common = ["--engine", "vllm", "--dtype", "bfloat16", "--max-model-len", "4096"]
            vl_args = [*common, "--model", args.vl, "--served-model-name", "vl"]
            vl_engine = ["--gpu-memory-utilization", args.mem, "--max-num-seqs", "256",
                         "--generation-config", "vllm", "--limit-mm-per-prompt", '{"image": 1}']
            vl = (gateway(procs, "gw-vl", vl_args, vl_engine, args.gateway_workers)
                  if args.vl else None)
            model, cls = "vl", None
            if args.cls:
                cgw = gateway(procs, "gw-cls", [*common, "--model", args.cls,
                                                "--served-model-name", "cls"],
                              ["--gpu-memory-utilization", args.cls_mem,
                               "--max-num-seqs", "256"], args.gateway_workers)
        try:
            wait_ready([p for p in procs if p.name.startswith("gw-")], args.ready_timeout)
        except RuntimeError:
            for log in LOGS.glob("work-*/*/replica.log"):  # the engine's own reason
                print(f"=== {log}\n" + "\n".join(log.read_text(errors="replace")
                                                   .splitlines()[-60:]), flush=True)
            raise
        if args.cls and not args.stub:
            serial = gateway(procs, "gw-cls-serial", ["--replica-url", replica_url(cgw),
                                                      "--served-model-name", "cls",
                                                      "--serialize", "on"], [])
            wait_ready([serial], 120)
            cls = (cgw, serial)
        more = (attached(procs, vl, model, args.attach_variant, args.gateway_workers, unproven)
                if vl else [])
        wait_ready(more, 120)
        result = asyncio.run(measure(args, vl, cls, model, more))
        result["loadavg"] = os.getloadavg()
        result["argv"] = " ".join(["bench_gateway_gpu.py", *sys.argv[1:]])
        for p in procs:
            if p.name.startswith("gw-"):
                result[f"ready_{p.name}"] = get_json(p.url + "/ready")[1]
        args.out.write_text(json.dumps(result, indent=1))
        print(report(result, args.judge), flush=True)


if __name__ == "__main__":
    main()
