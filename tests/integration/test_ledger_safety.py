"""The ledger under a real gateway process, STUB replicas behind (the gateway is under test):
a SIGKILL, an unreachable PostgreSQL, a full disk; and the ledger and replay commands."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from grm_service.ledger.query import all_records
from grm_service.ledger.sqlite import SqliteStore
from grm_service.ledger.store import Selection
from tests.support.procs import Proc, free_port, gateway_on_stubs
from tests.unit.ledger.test_location import bad_locations

INTERVAL_S = 0.2
# A batch handed to the writer is committed within this (a loaded machine included).
COMMIT_S = 1.0
MSGS = [{"role": "user", "content": "hello"}]


def ledger_of(gateway: Proc) -> Path:
    port = gateway.url.rsplit(":", 1)[1]
    return gateway.log.parent / f"work-{port}" / "ledger.sqlite"


def chat(gateway: Proc, n: int, run: str = "kill", pad: int = 0) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": f"q{n} " + "x" * pad}]}
    return httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30,
                      headers={"x-grm-run": run, "x-grm-step": str(n)})


def rows(path: Path) -> list[tuple[int, str]]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    store = SqliteStore(path, readonly=True)
    try:
        return [(int(r.origin.step or 0), r.request_digest)
                for r in all_records(store, Selection())]
    finally:
        store.close()


def dropped(gateway: Proc) -> float:
    for line in httpx.get(gateway.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("grm_ledger_dropped_records_total "):
            return float(line.split()[1])
    return 0.0


def test_a_sigkill_loses_at_most_the_last_flush_interval(tmp_path: Path,
                                                         stub_pair: list[Proc]) -> None:
    env = {"GRM_LEDGER_FLUSH_INTERVAL_S": str(INTERVAL_S)}
    with gateway_on_stubs(tmp_path, env=env, shared=stub_pair) as (gateway, _):
        answered: list[tuple[float, str]] = []
        stop = threading.Event()

        def load() -> None:
            n = 0
            while not stop.is_set():
                try:
                    r = chat(gateway, n)
                except httpx.HTTPError:
                    return  # killed
                if r.status_code == 200:
                    answered.append((time.monotonic(), r.headers["x-grm-request-digest"]))
                n += 1

        sender = threading.Thread(target=load)
        sender.start()
        # Answers older than a flush interval and a commit, whatever the machine's speed.
        while len(answered) < 60 or answered[0][0] > time.monotonic() - 2 * (INTERVAL_S
                                                                              + COMMIT_S):
            time.sleep(0.05)
        killed_at = time.monotonic()
        gateway.stop(signal.SIGKILL)
        stop.set()
        sender.join(30)
        kept = {req for _, req in rows(ledger_of(gateway))}
    safe = [req for at, req in answered if at < killed_at - INTERVAL_S - COMMIT_S]
    assert safe and set(safe) <= kept  # every answer older than an interval is on record
    assert kept <= {req for _, req in answered}  # and nothing that was not answered


def test_an_unreachable_postgres_keeps_answering_and_counts(tmp_path: Path,
                                                            stub_pair: list[Proc]) -> None:
    env = {"GRM_LEDGER_URL": f"postgresql://grm@127.0.0.1:{free_port()}/none",
           "GRM_LEDGER_FLUSH_INTERVAL_S": str(INTERVAL_S)}
    with gateway_on_stubs(tmp_path, env=env, shared=stub_pair) as (gateway, _):
        assert all(chat(gateway, n).status_code == 200 for n in range(20))
        deadline = time.monotonic() + 30
        while dropped(gateway) < 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert dropped(gateway) == 20
    log = gateway.log.read_text()
    assert log.count("ledger: ") == 1 and "answers go on" in log and "none" in log


def test_serve_on_a_ledger_that_can_never_work_refuses_to_start(tmp_path: Path) -> None:
    """Each location at once, before any replica (none is reachable here) or port: a fast
    non-zero exit naming the path and why, where a ready service dropped every record."""
    locations = bad_locations(tmp_path)
    started = time.monotonic()
    serving = {name: subprocess.Popen(
        [sys.executable, "-m", "grm_service.cli", "serve", "--port", str(free_port()),
         "--replica-url", f"http://127.0.0.1:{free_port()}", "--work-dir", str(tmp_path / name)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "GRM_LEDGER_URL": str(path)}) for name, (path, _) in locations.items()}
    try:
        for name, popen in serving.items():
            out, _ = popen.communicate(timeout=60)
            path, reason = locations[name]
            assert popen.returncode == 2, (name, out)
            assert str(path) in out and reason in out and "GRM_LEDGER=false" in out, (name, out)
    finally:
        for popen in serving.values():
            if popen.poll() is None:
                os.killpg(popen.pid, signal.SIGKILL)
    assert time.monotonic() - started < 30  # an import and a check, on a loaded machine


@contextlib.contextmanager
def tiny_disk(where: Path) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"a 1 MiB tmpfs cannot be mounted here: {mounted.stderr.decode()[:200]}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_disk_keeps_answering_and_counts(tmp_path: Path, stub_pair: list[Proc]) -> None:
    with tiny_disk(tmp_path / "disk") as disk:
        env = {"GRM_LEDGER_URL": str(disk / "ledger.sqlite"),
               "GRM_LEDGER_FLUSH_INTERVAL_S": str(INTERVAL_S)}
        with gateway_on_stubs(tmp_path, env=env, shared=stub_pair) as (gateway, _):
            # 40 bodies of 60 kB: twice what the disk holds.
            assert all(chat(gateway, n, pad=60_000).status_code == 200 for n in range(40))
            deadline = time.monotonic() + 30
            while dropped(gateway) == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert dropped(gateway) > 0
            assert chat(gateway, 99).status_code == 200
        assert 0 < len(rows(disk / "ledger.sqlite")) < 40  # what fitted, intact


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "grm_service.cli", *args], capture_output=True,
                          text=True, timeout=300, check=False)


def test_ledger_commands_and_a_replay_that_matches(tmp_path: Path) -> None:
    env = {"GRM_LEDGER_FLUSH_INTERVAL_S": str(INTERVAL_S)}
    with gateway_on_stubs(tmp_path, env=env) as (gateway, _):
        answers = [chat(gateway, n, run="grpo").json() for n in range(12)]
        time.sleep(INTERVAL_S + COMMIT_S)
        ledger = str(ledger_of(gateway))
        replayed = cli("replay", ledger, "--url", gateway.url, "--run", "grpo", "--steps",
                       "2:9", "--concurrency", "4")
        runs = cli("ledger", "runs", "--ledger", ledger)
        found = cli("ledger", "records", "--ledger", ledger, "--request-digest",
                    answers[3]["grm_fingerprint"]["request_digest"])
        record_id = found.stdout.split("│")[1].strip() if "│" in found.stdout else ""
        shown = cli("ledger", "show", record_id, "--ledger", ledger)
        out = tmp_path / "grpo.jsonl"
        exported = cli("ledger", "export", str(out), "--run", "grpo", "--ledger", ledger)
        diffed = cli("diff", str(out), str(out))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "grpo" in replayed.stdout and "8 " in replayed.stdout and "yes" in replayed.stdout
    assert runs.returncode == 0 and "grpo" in runs.stdout and "12" in runs.stdout
    assert shown.returncode == 0, found.stdout + shown.stderr
    assert '"content": "q3 "' in shown.stdout and answers[3]["id"] in shown.stdout
    assert exported.returncode == 0 and len(out.read_text().splitlines()) == 12
    assert diffed.returncode == 0


def test_a_replay_against_another_engine_version_compares_the_bits(tmp_path: Path) -> None:
    """The identity differs, the answers do not (a STUB's text depends on the request alone):
    the replay matches, because it compares what was produced, not the fingerprint."""
    env = {"GRM_LEDGER_FLUSH_INTERVAL_S": str(INTERVAL_S)}
    with gateway_on_stubs(tmp_path, env=env) as (first, _):
        for n in range(5):
            chat(first, n, run="a")
        time.sleep(INTERVAL_S + COMMIT_S)
        ledger = str(ledger_of(first))
    later = tmp_path / "later"
    later.mkdir()
    with gateway_on_stubs(later, stub_args=("--version", "9.9"), env=env) as (second, _):
        fingerprint = httpx.get(second.url + "/v1/fingerprint", timeout=10).json()
        replayed = cli("replay", ledger, "--url", second.url)
    assert fingerprint["engine_version"] == "9.9"
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "5 " in replayed.stdout and "yes" in replayed.stdout
