from __future__ import annotations

import json
from pathlib import Path

import pytest

from grm_service.commands.manifest import ManifestError, load_entries
from grm_service.commands.results import ResultWriter, read_rows
from grm_service.scoring.models import ItemResult
from tests.support.scoring import png


def result(i: int) -> ItemResult:
    return ItemResult(id=f"i{i}", score=i / 10, status="ok", response=f"r{i}", digest=str(i))


def test_folder_glob_jsonl_and_csv_inputs(tmp_path: Path) -> None:
    (tmp_path / "b.png").write_bytes(png("B"))
    (tmp_path / "a.png").write_bytes(png("A"))
    (tmp_path / "a.txt").write_text("ref A\n")
    (tmp_path / "notes.md").write_text("ignored")
    folder = load_entries([str(tmp_path)])
    assert [(e.id, e.reference) for e in folder] == [("a.png", "ref A"), ("b.png", None)]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "x", "image": "a.png", "reference": "R"}) + "\n\n")
    (entry,) = load_entries([str(manifest)])
    assert entry.image == tmp_path / "a.png" and entry.item().image is not None
    table = tmp_path / "m.csv"
    table.write_text("id,image,reference\ny,b.png,S\n")
    assert [e.id for e in load_entries([str(table)])] == ["y"]
    assert len(load_entries([str(tmp_path / "*.png")])) == 2


def test_input_problems_are_reported(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(png())
    with pytest.raises(ManifestError, match="appears twice"):
        load_entries([str(tmp_path), str(tmp_path)])
    with pytest.raises(ManifestError, match="no such file"):
        load_entries([str(tmp_path / "missing*.jpg")])
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n")
    with pytest.raises(ManifestError, match=r"bad\.jsonl:1"):
        load_entries([str(bad)])


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


async def test_ctrl_c_interrupts_a_running_task_group() -> None:
    import asyncio
    import os
    import signal

    from grm_service.commands.score import _until_interrupted

    finished = []

    async def work() -> None:
        async with asyncio.TaskGroup() as group:
            for _ in range(3):
                group.create_task(asyncio.sleep(10))
        finished.append(True)

    asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        await _until_interrupted(work())
    assert finished == []
