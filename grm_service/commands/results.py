"""Result files written as scoring completes, in input order, so an interrupted run resumes.

Lines are flushed one by one; on `--resume` a torn last line (a crash mid-write) is dropped and
the ids already present are skipped. A run that stops (a failed batch, Ctrl-C) still writes
every result that came back, those behind the missing ones too; the run that completes the file
puts its rows back in input order (`in_input_order`), so interrupted + resumed equals one
uninterrupted run.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Literal

from grm_service.wire import ItemResult

Format = Literal["jsonl", "csv"]
CSV_FIELDS = ("id", "score", "status", "error", "response", "fingerprint_id", "replica",
              "request_digest", "response_digest", "digest")


def format_of(path: Path, given: str | None) -> Format:
    fmt = given or ("csv" if path.suffix.lower() == ".csv" else "jsonl")
    if fmt not in ("jsonl", "csv"):
        raise ValueError(f"output format must be jsonl or csv, not {fmt!r}")
    return "csv" if fmt == "csv" else "jsonl"


def csv_row(result: ItemResult) -> dict[str, Any]:
    fp = result.fingerprint
    response = result.response
    return {
        "id": result.id, "score": "" if result.score is None else repr(result.score),
        "status": result.status, "error": result.error or "",
        "response": json.dumps(response) if isinstance(response, list) else response or "",
        "fingerprint_id": fp.fingerprint_id if fp else "", "replica": fp.replica if fp else "",
        "request_digest": fp.request_digest if fp else "",
        "response_digest": fp.response_digest if fp else "", "digest": result.digest,
    }


def _drop_torn_tail(path: Path) -> None:
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end != len(data):
        with path.open("r+b") as handle:
            handle.truncate(end)


def read_rows(path: Path, fmt: Format) -> list[dict[str, Any]]:
    """The complete rows of a result file (an absent file has none)."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    text = text[: text.rfind("\n") + 1]
    if fmt == "csv":
        return list(csv.DictReader(io.StringIO(text)))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class ResultWriter:
    """Appends results in input order; out-of-order completions wait for their predecessors."""

    def __init__(self, path: Path, fmt: Format, resume: bool) -> None:
        self.path, self.fmt = path, fmt
        if resume and path.is_file():
            _drop_torn_tail(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
        self.done = {str(row["id"]) for row in read_rows(path, fmt)}
        self._handle: IO[str] = path.open("a", encoding="utf-8", newline="")
        self._csv = csv.DictWriter(self._handle, CSV_FIELDS) if fmt == "csv" else None
        if self._csv is not None and not self.done and path.stat().st_size == 0:
            self._csv.writeheader()
        self._pending: dict[int, Sequence[ItemResult]] = {}
        self._next = 0

    def add(self, index: int, results: Sequence[ItemResult]) -> None:
        """Results of chunk `index` (0, 1, ...); written once every earlier chunk is."""
        self._pending[index] = results
        while self._next in self._pending:
            for result in self._pending.pop(self._next):
                self._write(result)
            self._next += 1
        self._handle.flush()

    def _write(self, result: ItemResult) -> None:
        if self._csv is not None:
            self._csv.writerow(csv_row(result))
        else:
            self._handle.write(json.dumps(result.to_json(), ensure_ascii=False,
                                       separators=(",", ":")) + "\n")

    def close(self) -> None:
        """Results still waiting for an earlier chunk that never came (a failed batch, Ctrl-C)
        are written too, after the others: nothing that came back is lost."""
        for index in sorted(self._pending):
            for result in self._pending.pop(index):
                self._write(result)
        self._handle.close()


def _records(path: Path, fmt: Format) -> list[tuple[str, list[str]]]:
    """Each row's id and fields as written (csv) or its line (jsonl), the csv header first."""
    with path.open(encoding="utf-8", newline="") as handle:
        if fmt == "csv":
            return [(row[0], row) for row in csv.reader(handle)]
        return [(str(json.loads(line)["id"]), [line]) for line in handle if line.strip()]


def in_input_order(path: Path, fmt: Format, ids: Sequence[str]) -> bool:
    """Rewrite the file with its rows in the order of `ids` (rows of other ids after them, as
    they were), where a stopped run left them out of it; False where they already were."""
    records = _records(path, fmt)
    header, rows = (records[:1], records[1:]) if fmt == "csv" else ([], records)
    rank = {item: i for i, item in enumerate(ids)}
    ordered = sorted(rows, key=lambda row: rank.get(row[0], len(rank)))
    if ordered == rows:
        return False
    temp = path.with_name(path.name + ".reordered")
    with temp.open("w", encoding="utf-8", newline="") as out:
        if fmt == "csv":
            csv.writer(out).writerows(fields for _, fields in header + ordered)
        else:
            out.writelines(line for _, (line,) in ordered)
    temp.replace(path)
    return True
