from __future__ import annotations

from pathlib import Path

import pytest

from grm_service.commands.results import ResultWriter, read_rows
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
