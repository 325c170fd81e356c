"""The declared public surface (docs/public-api.md): the package's `__all__`, `grm_service.client`
and `grm_service.integrations.*`; what the code outside the service (the benchmarks, the trainer
stand-ins, the client's wheel test) imports from grm_service is that surface, or is listed here
with the reason it reaches inside."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import grm_service
from grm_service import client, config, errors, wire

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = ("benchmarks", "tests/trainers", "tests/client_dist")
PUBLIC_MODULES = ("grm_service.client", "grm_service.integrations")
# The modules that building a test bed takes (the tiny offline models, the stub replica): the
# suites' and benchmarks' tools, not a surface for users.
TEST_BED = ("grm_service.tiny_models", "grm_service.tiny_dual", "grm_service.testing",
            "grm_service.probe_images")
# Files that measure or check a private part itself, by design: module prefixes they may import.
REACHES_INSIDE: dict[str, tuple[tuple[str, ...], str]] = {
    "benchmarks/bench_clip.py": (("grm_service.dual_scales", "grm_service.scoring.clip"),
                                 "the clip scorer's scales and logit, measured directly"),
    "benchmarks/bench_groups_held.py": (("grm_service.scoring",),
                                        "the held groups' store, measured without HTTP"),
    "benchmarks/bench_images.py": (("grm_service.canonical", "grm_service.fingerprint",
                                    "grm_service.gateway"),
                                   "the image checks and digests, per step, in-process"),
    "benchmarks/bench_fingerprint.py": (("grm_service.fingerprint",), "the digests' cost"),
    "benchmarks/bench_ledger.py": (("grm_service.ledger",), "the ledger's store and reads"),
    "benchmarks/bench_ledger_store.py": (("grm_service.ledger",), "the ledger's store"),
    "benchmarks/bench_shared_gate.py": (("grm_service.replicas", "grm_service.worker_side"),
                                        "the workers' shared gate, measured without HTTP"),
    "benchmarks/clip_cobatch.py": (("grm_service.fingerprint",), "output digests compared"),
    "benchmarks/cpu_inprocess.py": (("grm_service.gateway",),
                                    "the gateway in one process, its CPU per request profiled"),
    "benchmarks/gpu/bench_multi_gpu.py": (("grm_service.commands.prober", "grm_service.probes"),
                                          "the prober run against each replica"),
    "benchmarks/curves/plain.py": (("grm_service.engine_side", "grm_service.scoring"),
                                   "a baseline balancer scoring as the service scores"),
    "benchmarks/replica_start.py": (("grm_service.engines",), "a replica's recipe, timed"),
    "benchmarks/harness/stub_server.py": (("grm_service.gateway.request.answer",),
                                          "the stub answers the bytes the gateway parses"),
    "tests/trainers/test_verl_omni.py": (("grm_service.scoring.ocr",),
                                         "the expected reward, by the scorer the service runs"),
    "tests/trainers/test_verl_omni_images.py": (("grm_service.scoring.ocr",),
                                                "the expected reward, by the scorer itself"),
}


def imported(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of each grm_service import of a file, nested ones included."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
    return [(module, names) for module, names in found if module.split(".")[0] == "grm_service"]


def is_public(module: str, names: list[str]) -> bool:
    if module == "grm_service":
        return set(names) <= set(grm_service.__all__)
    if module == "grm_service.config":
        return set(names) <= {"Settings"}
    return module == "grm_service.errors" or module.startswith(PUBLIC_MODULES)


def private_imports(rel: str) -> list[str]:
    allowed = (*TEST_BED, *REACHES_INSIDE.get(rel, ((), ""))[0])
    return [f"{module} {names}" for module, names in imported(ROOT / rel)
            if not is_public(module, names)
            and not any(f"{module}.{name}".startswith(allowed) for name in names or [""])]


def outside_files() -> list[str]:
    """The project's own files there: not a hidden folder's (the peers' venv, caches)."""
    found = (path.relative_to(ROOT) for top in OUTSIDE for path in (ROOT / top).rglob("*.py"))
    return sorted(str(rel) for rel in found if not any(p.startswith(".") for p in rel.parts))


@pytest.mark.parametrize("rel", outside_files())
def test_code_outside_the_service_imports_only_the_public_surface(rel: str) -> None:
    assert private_imports(rel) == [], f"{rel}: use the public surface or the HTTP API"


def test_every_file_that_reaches_inside_still_does() -> None:
    """An allowance no longer needed goes, so the list stays the list of exceptions."""
    for rel, (prefixes, reason) in REACHES_INSIDE.items():
        assert reason and (ROOT / rel).is_file(), rel
        modules = [f"{m}.{n}" for m, names in imported(ROOT / rel) for n in names or [""]]
        assert any(m.startswith(prefixes) for m in modules), rel


def test_the_public_names_exist_and_are_their_modules_own() -> None:
    for name in grm_service.__all__:
        assert getattr(grm_service, name) is not None, name
    assert len(set(grm_service.__all__)) == len(grm_service.__all__)
    assert grm_service.Settings is config.Settings
    assert grm_service.client is client and grm_service.GrmClient is client.GrmClient
    assert grm_service.ScoreItem is wire.ScoreItem
    error_classes = {c for c in vars(errors).values()
                     if isinstance(c, type) and issubclass(c, errors.GrmError)}
    exported = {getattr(grm_service, n) for n in grm_service.__all__}
    assert error_classes <= exported  # every error of the tree, under its current name
    assert {"BackendFailed", "BackendRejected"}.isdisjoint(grm_service.__all__)
    with pytest.raises(AttributeError, match="no attribute 'proxy'"):
        grm_service.proxy  # noqa: B018


def test_importing_the_package_loads_neither_the_client_nor_the_server() -> None:
    """A server module imports `grm_service`; the client's httpx and the settings come only with
    a name that needs them."""
    code = ("import sys, grm_service; print(sorted(m for m in ('httpx', 'grm_service.client', "
            "'grm_service.config', 'pydantic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
