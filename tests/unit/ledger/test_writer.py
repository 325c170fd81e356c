"""The writer: batches committed off the loop; a store that fails costs records, not answers."""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from grm_service.ledger.location import open_store
from grm_service.ledger.store import Selection, row_values
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
