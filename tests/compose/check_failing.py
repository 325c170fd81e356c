"""Checks of the compose stack while its replicas cannot start (tests/compose/run.sh brings it
up with a model path that does not exist, then runs this before the healthy stack's checks).

1. Every port is published on 127.0.0.1 only (the default, docs/deployment.md).
2. Monitoring is up although no replica ever becomes healthy: Prometheus answers, and it has
   scraped the gateway's view of the failing start: every replica in a state other than ready
   (grm_replica_state), its last error (grm_replica_last_error), failed starts counted
   (grm_replica_start_failures_total), and the engines' relayed metrics marked down.
3. The gateway answers /ready 503 meanwhile, and no replica container is healthy.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from typing import Any

import httpx

REPLICAS = ("r0", "r1")
PUBLISHED = ("gateway-cpu", "prometheus")  # the services with ports in the CI stack
# Prometheus up, the gateway found (service discovery retries every 30-60 s while its name does
# not resolve yet), then a few 15 s scrapes: 120 s was once too short on a loaded CI machine.
WAIT_S = 240.0


def log(message: str) -> None:
    print(f"[check-failing {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{' '.join(argv)}: {result.stderr}"
    return result.stdout.strip()


def check_ports(docker: str, compose: list[str]) -> None:
    for service in PUBLISHED:
        (info,) = json.loads(run(docker, "inspect", run(*compose, "ps", "-q", service)))
        bindings = [b for ports in info["HostConfig"]["PortBindings"].values() for b in ports]
        assert bindings and all(b["HostIp"] == "127.0.0.1" for b in bindings), (service, bindings)
    log(f"ports of {', '.join(PUBLISHED)} published on 127.0.0.1 only")


def query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    try:
        r = httpx.get(prometheus + "/api/v1/query", params={"query": expr}, timeout=10)
    except httpx.HTTPError:
        return []
    result: list[dict[str, Any]] = r.json()["data"]["result"] if r.status_code == 200 else []
    return result


def by_replica(prometheus: str, expr: str, deadline: float) -> dict[str, dict[str, str]]:
    """The series of `expr` for every replica, once Prometheus has them all."""
    while True:
        found = {s["metric"].get("replica", ""): s["metric"] for s in query(prometheus, expr)}
        if set(REPLICAS) <= set(found):
            return found
        assert time.monotonic() < deadline, f"{expr}: only {sorted(found)} after {WAIT_S:.0f} s"
        time.sleep(2)


def check_monitoring(prometheus: str) -> None:
    deadline = time.monotonic() + WAIT_S
    states = by_replica(prometheus, 'grm_replica_state{job="grm-service"} == 1', deadline)
    assert all(m["state"] != "ready" for m in states.values()), states
    errors = by_replica(prometheus, "grm_replica_last_error == 1", deadline)
    assert all(m["error"] for m in errors.values()), errors
    by_replica(prometheus, "grm_replica_start_failures_total > 0", deadline)
    by_replica(prometheus, 'up{job="grm-engines"} == 0', deadline)
    log("prometheus, while no replica can start: states "
        f"{ {r: m['state'] for r, m in sorted(states.items())} }, last errors "
        f"{ {r: m['error'] for r, m in sorted(errors.items())} }, engine targets down")


def check_not_ready(gateway: str, docker: str, compose: list[str]) -> None:
    r = httpx.get(gateway + "/ready", timeout=10)
    assert r.status_code == 503, r.text
    for service in ("replica-cpu-0", "replica-cpu-1"):
        (info,) = json.loads(run(docker, "inspect", run(*compose, "ps", "-q", "-a", service)))
        health = (info["State"].get("Health") or {}).get("Status")
        assert health != "healthy", (service, info["State"])
    log("gateway /ready 503, no replica container healthy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--docker", default="docker")
    parser.add_argument("--compose", required=True, help="the compose command line, quoted")
    args = parser.parse_args()
    compose = shlex.split(args.compose)
    check_ports(args.docker, compose)
    check_monitoring(args.prometheus)
    check_not_ready(args.gateway, args.docker, compose)
    log("monitoring watched a failing start")
    return 0


if __name__ == "__main__":
    sys.exit(main())
