"""The writer: batches committed off the loop; a store that fails costs records, not answers."""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from grm_service.ledger import writer as writer_module
from grm_service.ledger.location import open_store
from grm_service.ledger.store import Selection, Store, row_values
from grm_service.ledger.writer import Writer
from tests.support.procs import free_port
from tests.unit.ledger.test_store import record


def counters() -> tuple[Counter, Counter, CollectorRegistry]:
    registry = CollectorRegistry()
    return (Counter("w", "written", registry=registry), Counter("d", "dropped", registry=registry),
            registry)


async def test_records_are_committed_each_interval(tmp_path: Path) -> None:
    location = str(tmp_path / "l.sqlite")
    written, dropped, registry = counters()
    writer = Writer(partial(open_store, location), 0.05, 100, (1 << 30, 1e9), written, dropped)
    writer.start()
    for n in range(10):
        writer.add(row_values(record(n)), 1)
    await asyncio.sleep(0.3)  # a few intervals; no close: what a SIGKILL would find
    assert len(open_store(location).records(Selection())) == 10
    assert registry.get_sample_value("w_total") == 10
    await writer.close()


async def test_an_unreachable_store_drops_counts_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nowhere = f"postgresql://grm@127.0.0.1:{free_port()}/postgres"
    written, dropped, registry = counters()
    writer = Writer(partial(open_store, nowhere), 0.01, 100, (1 << 30, 1e9), written, dropped)
    with caplog.at_level(logging.WARNING, "grm_service.ledger.writer"):
        for _ in range(3):
            writer.add(row_values(record(1)), 1)
            await writer.flush()
    assert writer.dropped == 3 and registry.get_sample_value("d_total") == 3
    assert len([r for r in caplog.records if "dropped" in r.getMessage()]) == 1
    await writer.close()


async def test_a_full_buffer_drops_its_oldest(tmp_path: Path) -> None:
    location = str(tmp_path / "l.sqlite")
    written, dropped, _ = counters()
    writer = Writer(partial(open_store, location), 60, 3, (1 << 30, 1e9), written, dropped)
    for n in range(5):
        writer.add(row_values(record(n)), 1)
    await writer.close()
    kept = [r.request_digest for r in open_store(location).records(Selection())]
    assert kept == ["req2", "req3", "req4"] and writer.dropped == 2


async def test_an_idle_writer_opens_its_store_and_still_prunes_when_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An empty flush goes to the writer's thread only to open the store or to prune: the
    store opens at the first flush, and records past their age go while nothing is written."""
    location = str(tmp_path / "l.sqlite")
    opened: list[int] = []

    def open_counted() -> Store:
        opened.append(1)
        return open_store(location)

    written, dropped, _ = counters()
    writer = Writer(open_counted, 60, 100, (1 << 30, 60.0), written, dropped)
    await writer.flush()
    assert opened == [1]
    writer.add(row_values(record(1, at=time.time() - 3600)), 1)  # an hour old: past the bound
    await writer.flush()  # written; the next prune is not due yet
    assert len(open_store(location).records(Selection())) == 1
    await writer.flush()
    assert len(open_store(location).records(Selection())) == 1
    monkeypatch.setattr(writer_module, "_PRUNE_EVERY_S", 0.0)
    await writer.flush()  # nothing buffered, a prune due
    assert open_store(location).records(Selection()) == [] and opened == [1]
    await writer.close()
