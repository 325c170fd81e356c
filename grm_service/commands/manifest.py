"""What `grm-service score` reads: image folders, globs, JSONL or CSV manifests.

A manifest row has `id`, `image` (a path, relative to the manifest), optional `reference` and
`prompt`. In a folder, `name.png` may have its reference beside it in `name.txt`.
"""

from __future__ import annotations

import csv
import glob
import json
import mimetypes
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grm_service.mime import encode_bytes
from grm_service.scoring.context import ItemError
from grm_service.wire import ScoreItem

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff"})


class ManifestError(ValueError):
    """The inputs cannot be read as a set of items (missing file, duplicate id, bad row)."""


@dataclass(frozen=True)
class Entry:
    id: str
    image: Path | None
    reference: str | None = None
    prompt: str | None = None

    def item(self) -> ScoreItem:
        """The item to send; ItemError when its image file cannot be read."""
        image = None
        if self.image is not None:
            try:
                raw = self.image.read_bytes()
            except OSError as err:
                raise ItemError(f"cannot read {self.image}: {err.strerror}") from None
            image = encode_bytes(raw, mimetypes.guess_type(self.image.name)[0] or "image/png")
        return ScoreItem(id=self.id, image=image, reference=self.reference, prompt=self.prompt)


def _image_entry(path: Path, root: Path | None) -> Entry:
    sidecar = path.with_suffix(".txt")
    reference = sidecar.read_text(encoding="utf-8").rstrip("\n") if sidecar.is_file() else None
    ident = path.relative_to(root).as_posix() if root else path.as_posix()
    return Entry(id=ident, image=path, reference=reference)


def _row_entry(row: dict[str, Any], base: Path, where: str) -> Entry:
    if not row.get("id"):
        raise ManifestError(f"{where}: row has no id")
    image = row.get("image")
    return Entry(id=str(row["id"]), image=base / str(image) if image else None,
                 reference=None if row.get("reference") is None else str(row["reference"]),
                 prompt=row.get("prompt") or None)


def _jsonl(path: Path) -> list[Entry]:
    entries = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError as err:
                raise ManifestError(f"{path}:{n}: not JSON: {err}") from None
            entries.append(_row_entry(row, path.parent, f"{path}:{n}"))
    return entries


def _csv(path: Path) -> list[Entry]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [_row_entry(row, path.parent, f"{path}:{n}")
                for n, row in enumerate(csv.DictReader(handle), 2)]


def _images(paths: Iterable[Path], root: Path | None) -> list[Entry]:
    """Image entries; ids are relative to `root`, or the paths as matched (globs)."""
    return [_image_entry(p, root) for p in sorted(paths) if p.suffix.lower() in IMAGE_SUFFIXES]


def _source(source: str) -> list[Entry]:
    path = Path(source)
    if path.is_dir():
        return _images(path.iterdir(), path)
    if path.suffix == ".jsonl" and path.is_file():
        return _jsonl(path)
    if path.suffix == ".csv" and path.is_file():
        return _csv(path)
    if path.is_file():
        return _images([path], path.parent)
    matches = [Path(m) for m in glob.glob(source, recursive=True)]
    if not matches:
        raise ManifestError(f"{source}: no such file, folder or matching glob")
    return _images(matches, None)


def load_entries(sources: Iterable[str]) -> list[Entry]:
    entries = [entry for source in sources for entry in _source(source)]
    seen: set[str] = set()
    for entry in entries:
        if entry.id in seen:
            raise ManifestError(f"id {entry.id!r} appears twice")
        seen.add(entry.id)
    return entries
