from __future__ import annotations

import json
from pathlib import Path

import pytest

from grm_service.commands.manifest import ManifestError, load_entries
from tests.support.scoring import png


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
