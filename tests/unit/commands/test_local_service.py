"""The start of a service for one command is shown as it goes: the gateway, then each
replica's state, until every replica is ready."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grm_service.commands.local_service import wait_ready


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A live process standing in for the service's (only its being alive is looked at)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_each_look_at_the_start_is_reported(child: subprocess.Popen[bytes],
                                            tmp_path: Path) -> None:
    looks = iter([None, [("r0", "starting"), ("r1", "starting")],
                  [("r0", "ready"), ("r1", "checking")], [("r0", "ready"), ("r1", "ready")]])

    def ready(request: httpx.Request) -> httpx.Response:
        replicas = next(looks)
        if replicas is None:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(503, json={"ready": False, "replicas": [
            {"name": name, "state": state} for name, state in replicas]})

    told: list[tuple[str, float]] = []
    with httpx.Client(transport=httpx.MockTransport(ready)) as http:
        wait_ready("http://svc", child, tmp_path / "gateway.log", 30,
                   lambda state, elapsed: told.append((state, elapsed)), http, interval_s=0)
    assert [state for state, _ in told] == [
        "starting the gateway", "replicas ready: 0/2 (r0 starting, r1 starting)",
        "replicas ready: 1/2 (r0 ready, r1 checking)"]
    assert all(0 <= elapsed < 30 for _, elapsed in told)
