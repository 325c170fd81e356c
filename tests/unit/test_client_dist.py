"""The client distribution's modules (client/pyproject.toml) import nothing of the server and
nothing that Python 3.10 lacks, so a trainer's environment gets httpx alone. Read from the
source: tests/client_dist installs the built wheel on 3.10 and 3.11 and runs it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import grm_service

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())
MODULES = PROJECT["tool"]["hatch"]["build"]["hooks"]["custom"]["modules"]
# The import names of the declared dependencies: httpx; numpy and PIL (the verl-omni extra).
THIRD_PARTY = {"httpx": "httpx", "numpy": "numpy", "PIL": "pillow"}
# Names Python 3.11 added that a module could reach for: (module, name).
NEWER = {("typing", "Self"), ("enum", "StrEnum"), ("asyncio", "timeout"),
         ("asyncio", "TaskGroup"), ("datetime", "UTC"), ("typing", "LiteralString"),
         ("typing", "Never"), ("typing", "assert_never"), ("typing", "reveal_type")}


def imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (a function's lazy import too), except those of
    an `if TYPE_CHECKING:` block, which never run."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(inner) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
                   for inner in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def file_of(module: str) -> str:
    path = module.replace(".", "/")
    return f"{path}/__init__.py" if (ROOT / path).is_dir() else f"{path}.py"


def test_every_adapter_and_the_client_are_in_the_distribution() -> None:
    adapters = {p.relative_to(ROOT).as_posix() for p in (ROOT / "grm_service/integrations")
                .glob("*.py")}
    assert adapters | {"grm_service/client.py", "grm_service/__init__.py"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_imports_only_the_distribution_httpx_and_the_standard_library(module: str) -> None:
    for name in imports(ROOT / module):
        top = name.partition(".")[0]
        if top == "grm_service":
            assert file_of(name) in MODULES, f"{module} imports {name}, not in the client"
        else:
            assert top in sys.stdlib_module_names or top in THIRD_PARTY, \
                f"{module} imports {name}: not a dependency of the client distribution"


@pytest.mark.parametrize("module", MODULES)
def test_nothing_newer_than_python_3_10(module: str) -> None:
    tree = ast.parse((ROOT / module).read_text())
    for node in ast.walk(tree):
        assert not isinstance(node, ast.TryStar), f"{module}:{node.lineno}: except* is 3.11"
        if isinstance(node, ast.ImportFrom):
            used = {(node.module, alias.name) for alias in node.names}
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            used = {(node.value.id, node.attr)}
        elif isinstance(node, ast.Name):
            used = {("builtins", node.id)}
        else:
            continue
        assert not used & (NEWER | {("builtins", "ExceptionGroup")}), f"{module}: {used}"
    assert "tomllib" not in imports(ROOT / module)
    # `X | Y` in annotations is text until evaluated; dataclasses never evaluate it.
    annotated = any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.AnnAssign)
                    for n in ast.walk(tree))
    future = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in tree.body)
    assert future or not annotated, f"{module} lacks `from __future__ import annotations`"


def test_the_distribution_is_the_servers_version_httpx_only_and_no_plugin() -> None:
    project = PROJECT["project"]
    assert project["version"] == grm_service.__version__
    assert project["requires-python"] == ">=3.10"
    assert [d.split(">")[0] for d in project["dependencies"]] == ["httpx"]
    assert "entry-points" not in project and "scripts" not in project


# The client distribution's environment, simulated: no server module, no pydantic.
CLIENT_ONLY = """
import importlib.abc, json, sys
shipped, blocked = set(sys.argv[1].split(",")), ("pydantic", "pydantic_settings", "fastapi")
class ClientOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked or (
                name.startswith("grm_service.") and name not in shipped):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, ClientOnly())
import grm_service
out = {"client": grm_service.GrmClient.__name__, "item": grm_service.ScoreItem.__name__}
try:
    grm_service.Settings
except ModuleNotFoundError as err:
    out["settings"] = str(err)
print(json.dumps(out))
"""


def test_the_package_root_gives_the_client_without_the_server_and_says_what_is_missing() -> None:
    shipped = ",".join(m.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                       for m in MODULES)
    run = subprocess.run([sys.executable, "-c", CLIENT_ONLY, shipped], capture_output=True,
                         text=True, timeout=60, check=True, cwd=ROOT)
    out = json.loads(run.stdout)
    assert out["client"] == "GrmClient" and out["item"] == "ScoreItem"
    assert out["settings"].startswith("grm_service.Settings comes with the server distribution")
