from __future__ import annotations

import json
from pathlib import Path

import pytest

from grm_service.commands.manifest import (
    ManifestError,
    load_entries,
    read_prompts,
    sidecar_role,
    with_prompts,
)
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


def test_sidecar_is_the_prompt_for_prompt_scorers(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(png("A"))
    (tmp_path / "a.txt").write_text("a red fox\n")
    assert sidecar_role("auto", "reward_head") == sidecar_role("auto", "clip") == "prompt"
    assert sidecar_role("auto", "ocr") == sidecar_role("reference", "clip") == "reference"
    (entry,) = load_entries([str(tmp_path)], sidecar_role("auto", "clip"))
    assert (entry.prompt, entry.reference) == ("a red fox", None)
    assert entry.item().prompt == "a red fox"
    with pytest.raises(ManifestError, match="--sidecar must be one of auto, prompt, reference"):
        sidecar_role("caption", "clip")


def test_prompt_manifest_gives_each_image_its_prompt(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / f"{name}.png").write_bytes(png(name))
    rows = tmp_path / "prompts.jsonl"
    rows.write_text(json.dumps({"image": "a.png", "prompt": "an A"}) + "\n"
                    + json.dumps({"id": "b.png", "prompt": "a B"}) + "\n")
    table = tmp_path / "prompts.csv"
    table.write_text("image,prompt\na.png,an A\nb.png,a B\n")
    entries = load_entries([str(tmp_path)])
    for manifest in (rows, table):
        given = with_prompts(entries, read_prompts(manifest))
        assert [(e.id, e.prompt) for e in given] == [("a.png", "an A"), ("b.png", "a B")]


@pytest.mark.parametrize(("text", "message"), [
    ('{"image": "a.png", "prompt": "x"}\n', r"1 image\(s\) have no prompt.*'b\.png'"),
    ('{"image": "a.png", "prompt": "x"}\n{"image": "b.png", "prompt": "y"}\n'
     '{"image": "c.png", "prompt": "z"}\n', r"not among the inputs \(first: 'c\.png'\)"),
    ('{"image": "a.png"}\n', r"prompts\.jsonl:1: a prompt row needs"),
    ('{"image": "a.png", "prompt": "x"}\n{"id": "a.png", "prompt": "y"}\n',
     r"prompts\.jsonl:2: 'a\.png' has a prompt already"),
    ("[1]\n", r"prompts\.jsonl:1: not a JSON object"),
])
def test_prompt_manifest_problems_name_the_row(tmp_path: Path, text: str, message: str) -> None:
    for name in ("a", "b"):
        (tmp_path / f"{name}.png").write_bytes(png(name))
    (tmp_path / "prompts.jsonl").write_text(text)
    entries = load_entries([str(tmp_path)])
    with pytest.raises(ManifestError, match=message):
        with_prompts(entries, read_prompts(tmp_path / "prompts.jsonl"))
