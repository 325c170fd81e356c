"""`grm-service diff A.jsonl B.jsonl`: which items differ between two scoring runs, and why.

The fingerprint names every input of an output, so a difference is explained by the first
component that differs: seed, model hash, engine version, env digest (and, given both service
identities, the env-digest inputs that differ), the request itself. Equal fingerprints and
requests with different outputs leave one explanation: the service was nondeterministic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NONDETERMINISM = "same fingerprint, different output: nondeterminism"
UNPROVEN = ("same unverified fingerprint, different output: nondeterminism, or a difference the "
            "replicas could not prove (model, environment, device)")
_CAUSES = (
    ("identity", "one side's replicas proved their identity, the other's did not"),
    ("seed", "seed differs"),
    ("model_hash", "model hash differs (different weights, tokenizer or config)"),
    ("engine_version", "engine version differs"),
    ("device", "device differs"),
    ("tensor_parallel_size", "tensor-parallel size differs (another reduction order: other bits)"),
    ("env_digest", "env digest differs"),
    ("request_digest", "request differs (prompt, image or sampling)"),
)

# Fingerprint fields newer than some result files: compared only where both sides recorded them.
_RECENT = frozenset({"tensor_parallel_size"})


@dataclass(frozen=True)
class ItemDiff:
    id: str
    cause: str
    detail: str


def load_results(path: Path) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ValueError(f"{path}:{number}: not a JSON line") from None
        if not isinstance(row, dict) or "id" not in row:
            raise ValueError(f"{path}:{number}: expected an object with an 'id'")
        rows[str(row["id"])] = row
    return rows


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(obj, dict):
        return {prefix: obj}
    flat: dict[str, Any] = {}
    for key, value in obj.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def env_input_changes(ident_a: dict[str, Any], ident_b: dict[str, Any]) -> list[str]:
    a, b = flatten(ident_a.get("env_inputs", {})), flatten(ident_b.get("env_inputs", {}))
    return [f"{key}: {a.get(key)!r} vs {b.get(key)!r}"
            for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]


def _same_output(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a.get("score") == b.get("score") and a.get("response") == b.get("response")
                and a.get("status") == b.get("status"))


def explain(a: dict[str, Any], b: dict[str, Any],
            identities: tuple[dict[str, Any], dict[str, Any]] | None = None) -> ItemDiff | None:
    if _same_output(a, b):
        return None
    fa, fb = a.get("fingerprint") or {}, b.get("fingerprint") or {}
    detail = f"score {a.get('score')!r} vs {b.get('score')!r}"
    if not fa or not fb:
        return ItemDiff(str(a["id"]), "no fingerprint on one side (an error item?)",
                        f"{detail}; errors: {a.get('error')!r} vs {b.get('error')!r}")
    for key, cause in _CAUSES:
        if key in _RECENT and not (key in fa and key in fb):
            continue  # a result file from before the field existed: the env digest tells
        if fa.get(key) != fb.get(key):
            if key == "env_digest" and identities is not None:
                changes = env_input_changes(*identities)
                cause += ": " + ("; ".join(changes) or "identities given show no difference")
            elif key == "env_digest":
                cause += " (pass --identity-a/--identity-b from GET /v1/fingerprint to see which "\
                         "input)"
            return ItemDiff(str(a["id"]), cause, f"{detail}; {fa.get(key)} vs {fb.get(key)}")
    if fa.get("identity") == "unverified":
        return ItemDiff(str(a["id"]), UNPROVEN, detail)
    return ItemDiff(str(a["id"]), NONDETERMINISM, detail)


def diff_runs(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]],
              identities: tuple[dict[str, Any], dict[str, Any]] | None = None) -> list[ItemDiff]:
    diffs = [ItemDiff(i, "only in A", "") for i in a if i not in b]
    diffs += [ItemDiff(i, "only in B", "") for i in b if i not in a]
    for item_id in (i for i in a if i in b):
        found = explain(a[item_id], b[item_id], identities)
        if found is not None:
            diffs.append(found)
    return diffs
