"""Checks of a running compose stack through its published ports (tests/compose/run.sh brings the
stack up; this only talks to it over HTTP and drives containers through docker / compose).

1. /ready lists every replica (one container each) ready.
2. An OCR-scored image batch returns per-item and batch fingerprints built from the serving
   replica's own identity: `identity: verified`, its device, and the same fingerprint id from
   both replica containers (also in /v1/fingerprint).
3. Prometheus has scraped grm_requests_total from the gateway, and each replica's engine
   metrics (vLLM's vllm:*) through the gateway's relay, found by its service discovery.
4. A replica container cut off the network (half-open connections) is failed over within the
   gateway's ack timeout and serves the same answers once reconnected. A replica container
   killed with `docker kill` is failed over with identical answers and
   comes back (`compose up -d`: Docker never restarts a container it was told to kill); a
   replica whose engine crashes is failed over and restarted by its restart policy. Both then
   serve the same answers as before.
5. `docker compose stop` with batches in flight: every one of them finishes, identical, within
   the stop grace period, and the gateway exits 0 (drained, not killed).
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import shlex
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

SAMPLING = {"max_tokens": 12}
REPLICA_SERVICES = ("replica-cpu-0", "replica-cpu-1")  # r0, r1: GRM_REPLICA_URLS' order
GATEWAY_SERVICE = "gateway-cpu"
STOP_GRACE_S = 60.0  # the gateway's stop_grace_period in deploy/docker-compose.yml
MAX_STOP_COPIES = 8  # copies of the items in one batch of the stop check
STOP_TRIES = 3  # of sending the stop check's four batches until all are in flight at once


def log(message: str) -> None:
    print(f"[check-stack {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass(frozen=True)
class Stack:
    gateway: str
    prometheus: str
    docker: str
    compose: list[str]

    def run(self, *argv: str, timeout: float = 300) -> str:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                check=False)
        assert result.returncode == 0, f"{' '.join(argv)}: {result.stderr}"
        return result.stdout.strip()

    def container(self, service: str) -> str:
        return self.run(*self.compose, "ps", "-q", "-a", service)

    def inspect(self, container: str) -> dict[str, Any]:
        (info,) = json.loads(self.run(self.docker, "inspect", container))
        return dict(info)


def sample_items(samples: Path) -> list[dict[str, Any]]:
    """The packaged sample images, each scored twice under two ids (rendezvous routes by
    the request, so eight requests spread over both replicas)."""
    items = []
    for line in (samples / "manifest.jsonl").read_text().splitlines():
        entry = json.loads(line)
        image = base64.b64encode((samples / entry["image"]).read_bytes()).decode()
        for copy in ("a", "b"):
            items.append({"id": f"{entry['id']}-{copy}", "image": image,
                          "reference": entry["reference"] if copy == "a" else entry["id"]})
    return items


def score(stack: Stack, items: list[dict[str, Any]], sampling: dict[str, Any] = SAMPLING,
          client: httpx.Client | None = None) -> dict[str, Any]:
    request = {"scorer": "ocr", "items": items, "sampling": sampling}
    url = stack.gateway + "/v1/score"
    r = client.post(url, json=request) if client else httpx.post(url, json=request, timeout=300)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    assert all(x["status"] == "ok" for x in body["results"]), body["results"]
    return body


def without_replica(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Results as compared across replicas: everything but the serving replica's name."""
    out = []
    for result in body["results"]:
        fingerprint = {k: v for k, v in result["fingerprint"].items() if k != "replica"}
        out.append({**result, "fingerprint": fingerprint})
    return out


def served_by(body: dict[str, Any]) -> dict[str, str]:
    return {r["id"]: r["fingerprint"]["replica"] for r in body["results"]}


def wait_ready(stack: Stack, timeout_s: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    replicas: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        try:
            r = httpx.get(stack.gateway + "/ready", timeout=5)
            replicas = r.json()["replicas"]
            if r.status_code == 200 and all(x["state"] == "ready" for x in replicas):
                return replicas
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(1)
    raise AssertionError(f"replicas not all ready after {timeout_s:.0f} s: {replicas}")


def check_ready(stack: Stack) -> None:
    replicas = wait_ready(stack, 60)
    assert len(replicas) == len(REPLICA_SERVICES), replicas
    urls = [f"http://{service}:8000" for service in REPLICA_SERVICES]
    assert [x["url"] for x in replicas] == urls, replicas
    log(f"/ready: {len(replicas)} replica containers ready: {[x['name'] for x in replicas]}")


def check_fingerprints(body: dict[str, Any]) -> None:
    prints = [r["fingerprint"] for r in body["results"]]
    replicas = {p["replica"] for p in prints}
    assert replicas == {"r0", "r1"}, f"one replica served everything: {served_by(body)}"
    for p in prints:
        # Each replica container computed and reported its own identity (/grm/identity).
        assert p["identity"] == "verified" and p["device"], p
        assert p["fingerprint_id"] and p["model_hash"] and p["env_digest"], p
        assert p["engine"] == "vllm-cpu" and p["engine_version"], p
        assert p["seed"] == 42 and p["request_digest"] and p["response_digest"], p
    by_replica = {r: {p["fingerprint_id"] for p in prints if p["replica"] == r} for r in replicas}
    assert by_replica["r0"] == by_replica["r1"] and len(by_replica["r0"]) == 1, by_replica
    batch = body["fingerprint"]
    assert batch["fingerprint_id"] in by_replica["r0"], batch
    assert batch["items"] == len(prints) and batch["errors"] == 0 and batch["digest"], batch
    log(f"score: {len(prints)} items ok, fingerprint {batch['fingerprint_id']} (identity "
        f"{prints[0]['identity']}, device {prints[0]['device']!r}) from both replica containers")


def check_repeat(stack: Stack, items: list[dict[str, Any]], first: dict[str, Any]) -> None:
    """The same batch again, computed again by the replicas (no answer from the ledger, see
    compose.ci.yml): the same results, bit for bit."""
    again = score(stack, items)
    cached = [r["id"] for r in again["results"] if "cache" in r["fingerprint"]]
    assert not cached, f"answered from the ledger, not by a replica: {cached}"
    assert again["results"] == first["results"], "a repeated batch changed"
    log(f"repeat: {len(items)} items recomputed by the replicas, identical")


def check_service_identity(stack: Stack, fingerprint_id: str) -> None:
    """`/v1/fingerprint`: the identity both replica containers reported, one id for both."""
    identity = httpx.get(stack.gateway + "/v1/fingerprint", timeout=10).json()
    assert identity["identity"] == "verified" and identity["fingerprint_id"] == fingerprint_id, (
        identity)
    assert identity["replicas"] == {"r0": fingerprint_id, "r1": fingerprint_id}, identity
    assert identity["unknown"] == [], identity
    log(f"/v1/fingerprint: verified, r0 and r1 both {fingerprint_id}")


def check_prometheus(stack: Stack) -> None:
    deadline = time.monotonic() + 90  # scrape interval 15 s
    series: list[Any] = []
    while time.monotonic() < deadline:
        r = httpx.get(stack.prometheus + "/api/v1/query", timeout=10,
                      params={"query": 'sum(grm_requests_total{job="grm-service"})'})
        series = r.json()["data"]["result"] if r.status_code == 200 else []
        if series and float(series[0]["value"][1]) > 0:
            log(f"prometheus: scraped grm_requests_total = {series[0]['value'][1]}")
            return
        time.sleep(2)
    raise AssertionError(f"prometheus has no grm_requests_total after 90 s: {series}")


def check_engine_metrics(stack: Stack) -> None:
    """vLLM's own metrics of both replica containers, scraped through the gateway's relay
    (job grm-engines, targets from its /metrics/targets): the engine's queue and tokens."""
    deadline = time.monotonic() + 120  # discovery refresh 30 s, then a 15 s scrape
    found: dict[str, float] = {}
    while time.monotonic() < deadline:
        r = httpx.get(stack.prometheus + "/api/v1/query", timeout=10, params={
            "query": 'sum by (replica) (vllm:prompt_tokens_total{job="grm-engines"})'})
        series = r.json()["data"]["result"] if r.status_code == 200 else []
        found = {s["metric"]["replica"]: float(s["value"][1]) for s in series}
        if set(found) == {"r0", "r1"} and min(found.values()) > 0:
            log(f"prometheus: scraped vllm:prompt_tokens_total of each engine {found}")
            return
        time.sleep(2)
    raise AssertionError(f"prometheus has no engine metrics of both replicas: {found}")


def pick_victim(stack: Stack, before: dict[str, Any]) -> tuple[str, str, str]:
    """The replica that served the most items: its name, service and container."""
    routes = served_by(before)
    victim = max(("r0", "r1"), key=lambda r: sum(v == r for v in routes.values()))
    service = REPLICA_SERVICES[int(victim[1:])]
    return victim, service, stack.container(service)


def check_failed_over(stack: Stack, items: list[dict[str, Any]], before: dict[str, Any],
                      victim: str) -> float:
    """Score the batch right after the victim died; returns how long the batch took."""
    started = time.monotonic()
    during = score(stack, items)
    assert without_replica(during) == without_replica(before), "failover changed answers"
    assert set(served_by(during).values()) == {"r1" if victim == "r0" else "r0"}, during
    assert during["fingerprint"] == before["fingerprint"], during["fingerprint"]
    return time.monotonic() - started


def check_back(stack: Stack, items: list[dict[str, Any]], before: dict[str, Any]) -> float:
    """Wait until every replica is ready and serves its own keys again (an open breaker keeps
    traffic away for a few seconds more); every answer meanwhile must be the same."""
    started = time.monotonic()
    wait_ready(stack, 600)
    # /ready can still show a crashed replica ready until the gateway's next health probe, and
    # the replica's engine then takes a minute or more to start on a loaded machine.
    deadline = time.monotonic() + 600
    while True:
        after = score(stack, items)
        assert without_replica(after) == without_replica(before), "answers changed"
        if after["results"] == before["results"]:
            return time.monotonic() - started
        assert time.monotonic() < deadline, f"routing did not return: {served_by(after)}"
        time.sleep(1)


def check_docker_kill(stack: Stack, items: list[dict[str, Any]], before: dict[str, Any]) -> None:
    """`docker kill`: failover; Docker counts it as a manual stop (no restart policy applies),
    so the replica comes back the way an operator brings it back, `compose up -d`."""
    victim, service, container = pick_victim(stack, before)
    stack.run(stack.docker, "kill", container)
    took = check_failed_over(stack, items, before, victim)
    log(f"docker kill {service} ({victim}): identical answers and batch fingerprint from the "
        f"other replica (batch took {took:.1f} s)")
    time.sleep(3)
    state = stack.inspect(container)["State"]
    assert state["Status"] == "exited", state  # Docker: a killed container is stopped by hand
    stack.run(*stack.compose, "up", "-d", "--no-build", "--no-deps", service)
    took = check_back(stack, items, before)
    log(f"{service}: stays down after docker kill (Docker's rule for every restart policy); "
        f"`compose up -d` brought it back, ready and answering as before in {took:.0f} s")


def check_partition(stack: Stack, items: list[dict[str, Any]], before: dict[str, Any],
                    network: str) -> None:
    """The replica drops off the network, alive but unreachable: no FIN or RST reaches the
    gateway, so its pooled keep-alive connections to it are half-open. Requests on them must fail
    over (GRM_REPLICA_ACK_TIMEOUT_S) rather than hang until the request timeout."""
    victim, service, container = pick_victim(stack, before)
    stack.run(stack.docker, "network", "disconnect", network, container)
    try:
        took = check_failed_over(stack, items, before, victim)
    finally:
        stack.run(stack.docker, "network", "connect", "--alias", service, network, container)
    log(f"{service} ({victim}) cut off the network: failed over, identical (batch took "
        f"{took:.1f} s)")
    back = check_back(stack, items, before)
    log(f"{service} reconnected: answering as before in {back:.0f} s")


def check_crash_restart(stack: Stack, items: list[dict[str, Any]], before: dict[str, Any],
                        ) -> None:
    """The engine dies inside its container (SIGKILL to the container's main process, as an OOM
    kill would): failover, then the restart policy brings the container back."""
    victim, service, container = pick_victim(stack, before)
    state = stack.inspect(container)
    stack.run("kill", "-KILL", str(state["State"]["Pid"]))
    failover_s = check_failed_over(stack, items, before, victim)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = stack.inspect(container)
        if now["RestartCount"] > state["RestartCount"] and now["State"]["Running"]:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"{service} was not restarted: {now['State']}")
    took = check_back(stack, items, before)
    log(f"crash of {service} ({victim}): failed over, identical (batch took {failover_s:.1f} s); "
        f"restarted by its restart policy (restart count {now['RestartCount']}), answering as "
        f"before in {took:.0f} s")


@dataclass
class Flights:
    """Score batches sent at once, each with the time its answer came (None: still running)."""

    futures: list[Future[dict[str, Any]]]
    started: float
    ended: list[float | None]
    trace: list[str]

    @classmethod
    def send(cls, pool: ThreadPoolExecutor, stack: Stack, items: list[dict[str, Any]],
             sampling: dict[str, Any], count: int) -> Flights:
        """Each batch on a client made before the clock starts: a client's TLS context alone
        is ~50 ms of CPU, and with every client made after it, under the replicas' load, the
        first poll went out 4.5 s after the batches in a run of `.ci/run`."""
        clients = [httpx.Client(timeout=300) for _ in range(count)]
        flights = cls([], time.monotonic(), [None] * count, [])

        def one(index: int) -> dict[str, Any]:
            try:
                with clients[index] as client:
                    return score(stack, items, sampling, client)
            finally:
                flights.ended[index] = time.monotonic() - flights.started

        flights.futures = [pool.submit(one, index) for index in range(count)]
        return flights

    def done(self) -> int:
        return sum(f.done() for f in self.futures)

    def describe(self) -> str:
        ends = ", ".join("running" if t is None else f"{t:.1f} s" for t in self.ended)
        return f"/ready polls (sent at + took: begun, done): {'; '.join(self.trace)}; " \
               f"answers after {ends}"


def wait_admitted(stack: Stack, flights: Flights, client: httpx.Client) -> int:
    """The score batches the gateway has begun (/ready): a batch sent is not yet in flight
    until the gateway has read its head, which a loaded machine can take a while to do.
    Returns early once a batch has finished: all of them can no longer be in flight. Each
    poll whose reading changed, or that took over 0.5 s, goes into the flights' trace."""
    last: tuple[int, int] | None = None
    while True:
        sent = time.monotonic()
        begun = int(client.get(stack.gateway + "/ready").json()["batches_in_flight"])
        took, done = time.monotonic() - sent, flights.done()
        if (begun, done) != last or took > 0.5:
            flights.trace.append(f"{sent - flights.started:.2f}+{took:.2f} s: {begun}, {done}")
            last = (begun, done)
        if begun >= len(flights.futures) or done or sent - flights.started > 30:
            return begun
        time.sleep(0.05)


def long_batch(stack: Stack, items: list[dict[str, Any]], sampling: dict[str, Any],
               ) -> tuple[list[dict[str, Any]], dict[str, Any], float]:
    """Copies of the items, as many as make one batch take ~2 s on this machine now, with the
    batch's answer and time, timed after a warm-up batch and again after each resize: the
    first batch after a replica's restart is no guide to the next (sized from it once, the
    four batches were never all begun before one had finished)."""
    score(stack, items, sampling)
    copies, took = 1, 0.0
    for _ in range(4):
        batch = [{**item, "id": f"{item['id']}-{copy}"} for copy in range(copies)
                 for item in items]
        started = time.monotonic()
        answer = score(stack, batch, sampling)
        took = time.monotonic() - started
        wanted = min(MAX_STOP_COPIES, math.ceil(copies * 2.0 / max(took, 0.01)))
        if took >= 1.5 or wanted <= copies:
            return batch, answer, took
        copies = wanted
    return batch, answer, took


def flights_in_stop(pool: ThreadPoolExecutor, stack: Stack, items: list[dict[str, Any]],
                    sampling: dict[str, Any], reference: list[dict[str, Any]]) -> Flights:
    """Four batches, all begun by the gateway and none finished. A try where one finished first
    is drained (its answers still checked) and made again, up to STOP_TRIES times; the failure
    shows each try's /ready polls and answer times. /ready is polled on one client, connected
    before the batches are sent."""
    tries = []
    with httpx.Client(timeout=10) as poller:
        poller.get(stack.gateway + "/ready").raise_for_status()
        for _ in range(STOP_TRIES):
            flights = Flights.send(pool, stack, items, sampling, 4)
            admitted = wait_admitted(stack, flights, poller)
            if admitted == len(flights.futures) and not flights.done():
                return flights
            tries.append(drained(flights, admitted, reference))
            log(f"stop check: the four batches were not all in flight at once; again. "
                f"{tries[-1]}")
    raise AssertionError(f"in {STOP_TRIES} tries, the four batches were never all in flight "
                         f"at once ({len(items)} items each): " + " | ".join(tries))


def drained(flights: Flights, admitted: int, reference: list[dict[str, Any]]) -> str:
    """A try's batches finished and checked; what its polls saw."""
    answers = [without_replica(f.result()) for f in flights.futures]
    assert all(a == reference for a in answers), "a batch changed its answers"
    return (f"{admitted} of {len(flights.futures)} begun, {flights.done()} done: "
            f"{flights.describe()}")


def check_graceful_stop(stack: Stack, items: list[dict[str, Any]]) -> None:
    # Batches long enough to be in flight when the stop begins, and short enough for the four
    # of them to drain well within the gateway's grace (one batch of the items took 0.3 to
    # over 1 s in CI runs).
    sampling = {"max_tokens": 96}
    items, first, one_s = long_batch(stack, items, sampling)
    reference = without_replica(first)
    gateway = stack.container(GATEWAY_SERVICE)
    with ThreadPoolExecutor(4) as pool:
        flights = flights_in_stop(pool, stack, items, sampling, reference)
        started = time.monotonic()
        stack.run(*stack.compose, "stop", timeout=STOP_GRACE_S + 60)
        took = time.monotonic() - started
        answers = [without_replica(f.result()) for f in flights.futures]
    assert all(a == reference for a in answers), "a batch in flight changed its answers"
    state = stack.inspect(gateway)["State"]
    assert state["ExitCode"] == 0 and not state["OOMKilled"], state
    assert took < STOP_GRACE_S, took
    codes = {s: stack.inspect(stack.container(s))["State"]["ExitCode"] for s in REPLICA_SERVICES}
    log(f"compose stop: {len(flights.futures)} batches of {len(items)} items ({one_s:.1f} s "
        f"alone) in flight all finished, identical; stop took {took:.1f} s "
        f"(grace {STOP_GRACE_S:.0f} s); gateway exit 0, replicas exit {codes}; "
        f"{flights.describe()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--docker", default="docker")
    parser.add_argument("--compose", required=True, help="the compose command line, quoted")
    parser.add_argument("--samples", type=Path, required=True)
    parser.add_argument("--network", required=True, help="the stack's network (docker name)")
    args = parser.parse_args()
    stack = Stack(args.gateway, args.prometheus, args.docker, shlex.split(args.compose))
    items = sample_items(args.samples)
    check_ready(stack)
    first = score(stack, items)
    check_fingerprints(first)
    check_service_identity(stack, first["fingerprint"]["fingerprint_id"])
    check_repeat(stack, items, first)
    check_prometheus(stack)
    check_engine_metrics(stack)
    check_partition(stack, items, first, args.network)
    check_docker_kill(stack, items, first)
    check_crash_restart(stack, items, first)
    check_graceful_stop(stack, items)
    log("all stack checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
