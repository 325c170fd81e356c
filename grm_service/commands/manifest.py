"""What `grm-service score` reads: image folders, globs, JSONL or CSV manifests, prompt manifests.

A manifest row has `id`, `image` (a path, relative to the manifest), optional `reference` and
`prompt`. In a folder, `name.png` may have a text beside it in `name.txt` (a "sidecar"): the
image's prompt for the scorers that score an image against its prompt (`clip`, `reward_head`),
its reference otherwise (`ocr`: the text the image should show); `--sidecar` says which.

A prompt manifest (`--prompts FILE`, JSONL or CSV) gives the images of folders and globs their
prompts: each row names an image by its item id (`id`, or `image`: the path relative to its
folder, as the results' `id` column shows it) and has a `prompt`. Every image must then have a
row, and every row an image: a typo is refused, never scored without its prompt.
"""

from __future__ import annotations

import csv
import glob
import json
import mimetypes
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from grm_service.mime import encode_bytes
from grm_service.scoring.context import ItemError
from grm_service.wire import ScoreItem

# The built-in scorers that score an image against its prompt: a sidecar text is the prompt.
PROMPT_SCORERS = frozenset({"clip", "reward_head"})
SIDECARS = ("auto", "prompt", "reference")
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


def sidecar_role(sidecar: str, scorer: str) -> str:
    """What a `name.txt` beside `name.png` is for this scorer: "prompt" or "reference"."""
    if sidecar not in SIDECARS:
        raise ManifestError(f"--sidecar must be one of {', '.join(SIDECARS)}, not {sidecar!r}")
    if sidecar != "auto":
        return sidecar
    return "prompt" if scorer in PROMPT_SCORERS else "reference"


def _image_entry(path: Path, root: Path | None, role: str) -> Entry:
    sidecar = path.with_suffix(".txt")
    text = sidecar.read_text(encoding="utf-8").rstrip("\n") if sidecar.is_file() else None
    ident = path.relative_to(root).as_posix() if root else path.as_posix()
    if role == "prompt":
        return Entry(id=ident, image=path, prompt=text)
    return Entry(id=ident, image=path, reference=text)


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


def _images(paths: Iterable[Path], root: Path | None, role: str) -> list[Entry]:
    """Image entries; ids are relative to `root`, or the paths as matched (globs)."""
    return [_image_entry(p, root, role) for p in sorted(paths)
            if p.suffix.lower() in IMAGE_SUFFIXES]


def _source(source: str, role: str) -> list[Entry]:
    path = Path(source)
    if path.is_dir():
        return _images(path.iterdir(), path, role)
    if path.suffix == ".jsonl" and path.is_file():
        return _jsonl(path)
    if path.suffix == ".csv" and path.is_file():
        return _csv(path)
    if path.is_file():
        return _images([path], path.parent, role)
    matches = [Path(m) for m in glob.glob(source, recursive=True)]
    if not matches:
        raise ManifestError(f"{source}: no such file, folder or matching glob")
    return _images(matches, None, role)


def load_entries(sources: Iterable[str], sidecar_as: str = "reference") -> list[Entry]:
    """The items of `sources`; `sidecar_as` ("reference" or "prompt"): what `name.txt` is."""
    entries = [entry for source in sources for entry in _source(source, sidecar_as)]
    seen: set[str] = set()
    for entry in entries:
        if entry.id in seen:
            raise ManifestError(f"id {entry.id!r} appears twice")
        seen.add(entry.id)
    return entries


def _prompt_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append({"at": f"{path}:{n}", **json.loads(line)})
                except (ValueError, TypeError) as err:
                    raise ManifestError(f"{path}:{n}: not a JSON object: {err}") from None
        return rows
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            return [{"at": f"{path}:{n}", **row} for n, row in enumerate(csv.DictReader(handle), 2)]
    raise ManifestError(f"{path}: a prompt manifest is .jsonl or .csv")


def read_prompts(path: Path) -> dict[str, str]:
    """A prompt manifest: item id (`id` or `image`) -> prompt; ManifestError naming the row."""
    if not path.is_file():
        raise ManifestError(f"{path}: no such prompt manifest")
    prompts: dict[str, str] = {}
    for row in _prompt_rows(path):
        ident, prompt = row.get("id") or row.get("image"), row.get("prompt")
        if not ident or not isinstance(prompt, str) or not prompt:
            raise ManifestError(f"{row['at']}: a prompt row needs `id` (or `image`) and a "
                                "non-empty `prompt`")
        if str(ident) in prompts:
            raise ManifestError(f"{row['at']}: {ident!r} has a prompt already")
        prompts[str(ident)] = prompt
    return prompts


def with_prompts(entries: list[Entry], prompts: dict[str, str]) -> list[Entry]:
    """Each entry with its prompt from the manifest; every image needs one, every row an image."""
    missing = [e.id for e in entries if e.id not in prompts]
    if missing:
        raise ManifestError(f"{len(missing)} image(s) have no prompt in the prompt manifest "
                            f"(first: {missing[0]!r}); its rows name images by their id")
    unknown = sorted(set(prompts) - {e.id for e in entries})
    if unknown:
        raise ManifestError(f"the prompt manifest names {len(unknown)} image(s) not among the "
                            f"inputs (first: {unknown[0]!r})")
    return [replace(e, prompt=prompts[e.id]) for e in entries]
