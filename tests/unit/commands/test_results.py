from __future__ import annotations

from pathlib import Path

import pytest

from grm_service.commands.results import ResultWriter, in_input_order, read_rows
from grm_service.wire import ItemResult


def result(i: int) -> ItemResult:
    return ItemResult(id=f"i{i}", score=i / 10, status="ok", response=f"r{i}", digest=str(i))


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_writer_keeps_input_order_and_resumes_after_a_torn_line(
    tmp_path: Path, fmt: str
) -> None:
    full, part = tmp_path / f"full.{fmt}", tmp_path / f"part.{fmt}"
    writer = ResultWriter(full, fmt, resume=False)  # type: ignore[arg-type]
    writer.add(1, [result(2), result(3)])  # completes first, waits for chunk 0
    assert read_rows(full, fmt) == []  # type: ignore[arg-type]
    writer.add(0, [result(0), result(1)])
    writer.add(2, [result(4)])
    writer.close()
    assert [r["id"] for r in read_rows(full, fmt)] == ["i0", "i1", "i2", "i3", "i4"]  # type: ignore[arg-type]

    first = ResultWriter(part, fmt, resume=False)  # type: ignore[arg-type]
    first.add(0, [result(0), result(1)])
    first.close()
    with part.open("a") as handle:
        handle.write('{"id": "i2", "sco')  # a crash in the middle of a line
    again = ResultWriter(part, fmt, resume=True)  # type: ignore[arg-type]
    assert again.done == {"i0", "i1"}
    again.add(0, [result(2), result(3), result(4)])
    again.close()
    assert part.read_bytes() == full.read_bytes()


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_stopped_run_keeps_what_came_back_and_the_run_that_completes_restores_the_order(
    tmp_path: Path, fmt: str
) -> None:
    full, part = tmp_path / f"full.{fmt}", tmp_path / f"part.{fmt}"
    odd = ItemResult(id="i2", score=0.2, status="ok", response='a,\r\n"b"', digest="2")
    writer = ResultWriter(full, fmt, resume=False)  # type: ignore[arg-type]
    writer.add(0, [result(0), result(1)])
    writer.add(1, [odd, result(3)])
    writer.add(2, [result(4)])
    writer.close()

    stopped = ResultWriter(part, fmt, resume=False)  # type: ignore[arg-type]
    stopped.add(1, [odd, result(3)])  # chunk 0 failed: these came back all the same
    stopped.add(2, [result(4)])
    stopped.close()
    assert [r["id"] for r in read_rows(part, fmt)] == ["i2", "i3", "i4"]  # type: ignore[arg-type]
    resumed = ResultWriter(part, fmt, resume=True)  # type: ignore[arg-type]
    assert resumed.done == {"i2", "i3", "i4"}
    resumed.add(0, [result(0), result(1)])
    resumed.close()
    ids = [f"i{i}" for i in range(5)]
    assert in_input_order(part, fmt, ids)  # type: ignore[arg-type]
    assert part.read_bytes() == full.read_bytes()
    assert not in_input_order(part, fmt, ids)  # type: ignore[arg-type]
