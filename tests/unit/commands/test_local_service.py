"""A service for one command: started with the spec's settings, shown as it starts (the
gateway, then each replica's state) until every replica is ready, and stopped after, its
process group killed if it hangs. Its replicas here are STUBs it attaches to: no engine starts."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grm_service.commands.local_service import ServeSpec, local_service, stop, wait_ready
from grm_service.config import EngineName
from tests.support.cli import settings_for
from tests.support.procs import Proc


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


def never_ready(request: httpx.Request) -> httpx.Response:
    return httpx.Response(503, json={"ready": False, "replicas": [{"name": "r0",
                                                                   "state": "starting"}]})


@pytest.mark.parametrize("log_lines", [40, None])
def test_a_start_that_takes_too_long_fails_with_the_logs_tail(
        child: subprocess.Popen[bytes], tmp_path: Path, log_lines: int | None) -> None:
    """The last 30 lines of the service's log say why; with no log, nothing is made up."""
    log = tmp_path / "gateway.log"
    if log_lines is not None:
        log.write_text("".join(f"line {i}\n" for i in range(log_lines)))
    with httpx.Client(transport=httpx.MockTransport(never_ready)) as http, \
            pytest.raises(RuntimeError) as failed:
        wait_ready("http://svc", child, log, 0.05, None, http, interval_s=0.01)
    head, tail = str(failed.value).split("\n", 1)
    assert head == "service not ready after 0 s:"
    expected = [] if log_lines is None else [f"line {i}" for i in range(10, 40)]
    assert tail.splitlines() == expected


def running(pid: int) -> bool:
    """Alive and not a zombie (what the test started is reaped; an orphan waits for init)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def serving(work_dir: Path) -> list[int]:
    """The running processes whose command line names `work_dir`: the service started on it."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if str(work_dir).encode() in (entry / "cmdline").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
    return [pid for pid in found if running(pid)]


@pytest.mark.parametrize("keys", [None, " k1, k2"])
def test_the_service_is_yielded_ready_and_stopped_after(tmp_path: Path, stub: Proc,
                                                       keys: str | None) -> None:
    """Started with the spec's env (here: attach to a STUB, no engine), yielded once every
    replica is ready, stopped by SIGTERM on the way out. Where that env sets keys, the
    readiness looks send one: a keyed /ready lists its replicas to an asker with a key only."""
    work_dir = tmp_path / "work"
    spec = ServeSpec(model="rm", work_dir=work_dir, env={
        "GRM_REPLICA_URLS": stub.url, "GRM_CACHE_DIR": str(tmp_path / "cache"),
        **({"GRM_API_KEYS": keys} if keys else {})})
    assert spec.api_key() == ("k1" if keys else None)
    headers = {"Authorization": "Bearer k2"} if keys else None
    told: list[str] = []
    try:
        with local_service(spec, timeout=30,
                           report=lambda state, _: told.append(state)) as url:
            assert url.startswith("http://127.0.0.1:")
            replicas = httpx.get(url + "/ready", headers=headers, timeout=5).json()["replicas"]
            assert [(r["url"], r["state"]) for r in replicas] == [(stub.url, "ready")]
            assert len(serving(work_dir)) == 1
        assert serving(work_dir) == []
    finally:
        for pid in serving(work_dir):  # a service left running fails the test, then goes
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    # The first look comes before the child can answer; it was shown.
    assert told[0] == "starting the gateway"
    # SIGTERM let it drain, rather than its being killed.
    assert "drained" in (work_dir / "gateway.log").read_text()


def test_a_service_that_exits_fails_its_start_with_why(tmp_path: Path) -> None:
    """The child's own words, from its log, at the next look: not a wait until the timeout."""
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["sh", "-c", "echo 'Invalid value: --replica-urls'; exit 2"],
                                stdout=out)
    proc.wait()
    with httpx.Client(transport=httpx.MockTransport(never_ready)) as http, \
            pytest.raises(RuntimeError) as failed:
        wait_ready("http://svc", proc, log, 60, None, http, interval_s=0)
    assert str(failed.value) == "service exited with 2:\nInvalid value: --replica-urls"


def test_what_the_spec_leaves_unset_the_child_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    """`None` adds no flag, so the child's own settings (GRM_*, else defaults) decide; a value
    is a flag, which they cannot change."""
    for name, value in (("GRM_ENGINE", "vllm"), ("GRM_SEED", "7"), ("GRM_MAX_MODEL_LEN", "4096")):
        monkeypatch.setenv(name, value)
    unset = ServeSpec(model="m", work_dir=Path("w"), engine=None, max_model_len=None, seed=None)
    child = settings_for("serve", unset.argv(8123)[4:])
    assert (child.engine, child.seed, child.max_model_len) == (EngineName.VLLM, 7, 4096)
    pinned = ServeSpec(model="m", work_dir=Path("w"), engine="vllm-cpu", max_model_len=512,
                       seed=42)
    child = settings_for("serve", pinned.argv(8123)[4:])
    assert (child.engine, child.seed, child.max_model_len) == (EngineName.VLLM_CPU, 42, 512)


def test_stop_sigterms_the_service_and_waits_for_it() -> None:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    stop(proc, grace_s=30)
    assert proc.returncode == -signal.SIGTERM


def test_a_service_that_hangs_on_sigterm_has_its_group_killed(
        caplog: pytest.LogCaptureFixture) -> None:
    """After the grace, SIGKILL to its whole group: its replicas too, even those that ignore
    SIGTERM; and the operator is told."""
    # Both ignore SIGTERM (the ignore is inherited); the shell says its child's pid.
    proc = subprocess.Popen(["sh", "-c", 'trap "" TERM; sleep 60 & echo $!; wait'],
                            start_new_session=True, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        replica = int(proc.stdout.readline())
        with caplog.at_level(logging.WARNING, logger="grm_service.commands.local_service"):
            stop(proc, grace_s=0.2)
        assert proc.returncode == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while running(replica) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not running(replica)
        assert [r.getMessage() for r in caplog.records] == [
            f"service {proc.pid} did not stop in 0 s: killing its group"]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()


def test_the_key_sent_is_one_the_child_reads_from_its_file_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child's keys come from its environment: the spec's env over this process's, the
    variable and the keys file alike (`#` lines skipped); a file it cannot read gives none."""
    monkeypatch.delenv("GRM_API_KEYS", raising=False)
    keys = tmp_path / "keys"
    keys.write_text("# rotated monthly\nfrom-file\n")
    assert ServeSpec("rm", tmp_path).api_key() is None
    monkeypatch.setenv("GRM_API_KEYS_FILE", str(keys))
    assert ServeSpec("rm", tmp_path).api_key() == "from-file"
    assert ServeSpec("rm", tmp_path, env={"GRM_API_KEYS": "given"}).api_key() == "given"
    gone = ServeSpec("rm", tmp_path, env={"GRM_API_KEYS_FILE": str(tmp_path / "absent")})
    assert gone.api_key() is None
