"""grm_service.engine_side.compat: import hooks for broken torch-family wheels, checked in fresh
interpreters.

Each check runs in a child Python with the boot folder on PYTHONPATH, as the engine profile
starts vLLM, so the hooks never leak into the test process. Fake `torchaudio`/`torchcodec`/
`torchvision` packages placed before site-packages stand in for broken and working wheels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grm_service.engine_side import compat

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, *pythonpath: Path | str) -> dict[str, object]:
    """Run `code` in a child interpreter; it must print one JSON object as its last line."""
    entries = [compat.child_pythonpath_entry(), *map(str, pythonpath), str(REPO_ROOT)]
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(entries)}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    parsed: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return parsed


def write_package(root: Path, name: str, init: str, **submodules: str) -> Path:
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(init), encoding="utf-8")
    for submodule, source in submodules.items():
        (package / f"{submodule}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    return root


def test_child_entry_is_a_packaged_folder_with_sitecustomize() -> None:
    entry = Path(compat.child_pythonpath_entry())
    assert entry.is_absolute()
    assert entry.parent == Path(compat.__file__).resolve().parent
    assert (entry / "sitecustomize.py").is_file()


def test_boot_installs_hooks_once_even_when_install_is_called_again() -> None:
    out = run_python(
        """
        import json, sys
        from grm_service.engine_side import compat
        compat.install(); compat.install()
        names = [getattr(f, "__name__", type(f).__name__) for f in sys.meta_path]
        hooks = [n for n in names if n.startswith("_")]
        print(json.dumps({"names": names, "hooks": hooks}))
        """
    )
    assert out["hooks"] == ["_TorchvisionSchemaFinder", "_HidingPathFinder"]
    assert "PathFinder" not in out["names"]


def test_without_boot_entry_no_hooks_are_installed() -> None:
    env = {"PATH": os.environ.get("PATH", "")}
    code = "import sys; print(any(hasattr(f, '_grm_service_compat_hook') for f in sys.meta_path))"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_normal_imports_and_metadata_still_work() -> None:
    out = run_python(
        """
        import importlib.metadata, importlib.util, json
        import email.mime.text  # a stdlib package with submodules
        print(json.dumps({
            "missing": importlib.util.find_spec("surely_not_installed_pkg") is None,
            "pytest": importlib.metadata.version("pytest"),
        }))
        """
    )
    assert out["missing"] is True
    assert out["pytest"] == pytest.__version__


BROKEN_INIT = """
    from . import _partial  # leaves a submodule behind before the native load fails
    raise OSError("Could not load this library: _torchaudio.so")
"""


def test_broken_package_looks_absent(tmp_path: Path) -> None:
    fakes = write_package(tmp_path, "torchaudio", BROKEN_INIT, _partial="")
    out = run_python(
        """
        import importlib.util, json, sys
        spec_is_none = importlib.util.find_spec("torchaudio") is None
        try:
            import torchaudio
            error = None
        except ModuleNotFoundError as exc:
            error = type(exc).__name__
        hook = next(f for f in sys.meta_path if hasattr(f, "hidden"))
        print(json.dumps({
            "spec_is_none": spec_is_none,
            "error": error,
            "leftovers": sorted(k for k in sys.modules if k.startswith("torchaudio.")),
            "hidden": sorted(hook.hidden),
        }))
        """,
        fakes,
    )
    assert out == {
        "spec_is_none": True,
        "error": "ModuleNotFoundError",
        "leftovers": [],
        "hidden": ["torchaudio"],
    }


def test_broken_package_imported_first_raises_module_not_found(tmp_path: Path) -> None:
    fakes = write_package(tmp_path, "torchcodec", BROKEN_INIT, _partial="")
    out = run_python(
        """
        import importlib.util, json
        try:
            from torchcodec.decoders import VideoDecoder
            error = None
        except ImportError as exc:
            error = type(exc).__name__
        print(json.dumps({"error": error, "spec": importlib.util.find_spec("torchcodec")}))
        """,
        fakes,
    )
    assert out == {"error": "ModuleNotFoundError", "spec": None}


WORKING_INIT = """
    import builtins
    builtins.executions = getattr(builtins, "executions", 0) + 1
"""


@pytest.mark.parametrize("lookup_first", [True, False])
def test_working_package_is_untouched_and_executed_once(tmp_path: Path, lookup_first: bool) -> None:
    fakes = write_package(tmp_path, "torchaudio", WORKING_INIT, functional="VALUE = 7\n")
    out = run_python(
        f"""
        import builtins, importlib.util, json, sys
        if {lookup_first}:
            assert importlib.util.find_spec("torchaudio") is not None
        import torchaudio
        import torchaudio.functional
        hook = next(f for f in sys.meta_path if hasattr(f, "hidden"))
        print(json.dumps({{
            "executions": builtins.executions,
            "origin": torchaudio.__spec__.origin,
            "loader": type(torchaudio.__spec__.loader).__name__,
            "value": torchaudio.functional.VALUE,
            "hidden": sorted(hook.hidden),
        }}))
        """,
        fakes,
    )
    assert out == {
        "executions": 1,
        "origin": str(fakes / "torchaudio" / "__init__.py"),
        "loader": "SourceFileLoader",
        "value": 7,
        "hidden": [],
    }


FAKE_TORCHVISION_INIT = """
    from . import extension
    from . import _meta_registrations
"""
FAKE_META_REGISTRATIONS = """
    import sys
    compat = sys.modules["_grm_service_compat"]
    DEFINED_BY_COMPAT = bool(compat._torchvision_library)
"""


def test_torchvision_hook_is_a_no_op_when_its_ops_load(tmp_path: Path) -> None:
    fakes = write_package(
        tmp_path,
        "torchvision",
        FAKE_TORCHVISION_INIT,
        extension="def _has_ops():\n    return True\n",
        _meta_registrations=FAKE_META_REGISTRATIONS,
    )
    out = run_python(
        """
        import json, sys
        import torchvision
        print(json.dumps({
            "defined": torchvision._meta_registrations.DEFINED_BY_COMPAT,
            "torch_imported": "torch" in sys.modules,
        }))
        """,
        fakes,
    )
    assert out == {"defined": False, "torch_imported": False}


def test_torchvision_schemas_are_defined_when_its_ops_do_not_load(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    fakes = write_package(
        tmp_path,
        "torchvision",
        FAKE_TORCHVISION_INIT,
        extension="def _has_ops():\n    return False\n",
        _meta_registrations=FAKE_META_REGISTRATIONS,
    )
    out = run_python(
        """
        import json
        import torch
        import torchvision
        print(json.dumps({
            "defined": torchvision._meta_registrations.DEFINED_BY_COMPAT,
            "ops": [hasattr(torch.ops.torchvision, op) for op in ("nms", "qnms")],
        }))
        """,
        fakes,
    )
    assert out == {"defined": True, "ops": [True, True]}


def test_torchvision_that_still_fails_is_hidden(tmp_path: Path) -> None:
    fakes = write_package(
        tmp_path,
        "torchvision",
        "from . import extension\nraise RuntimeError('operator torchvision::x does not exist')\n",
        extension="def _has_ops():\n    return True\n",
        _meta_registrations="",
    )
    out = run_python(
        """
        import importlib.util, json
        print(json.dumps({"spec": importlib.util.find_spec("torchvision")}))
        """,
        fakes,
    )
    assert out == {"spec": None}


def test_spawned_children_inherit_the_hooks() -> None:
    out = run_python(
        """
        import json, multiprocessing, sys

        HOOKED = "any(hasattr(f, '_grm_service_compat_hook') for f in __import__('sys').meta_path)"
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            child = pool.apply(eval, (HOOKED,))
        print(json.dumps({"parent": eval(HOOKED), "child": child}))
        """
    )
    assert out == {"parent": True, "child": True}


def test_a_shadowed_sitecustomize_still_runs(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.other_ran = True\n")
    out = run_python(
        "import builtins, json; print(json.dumps({'ran': getattr(builtins, 'other_ran', 0)}))",
        other,
    )
    assert out == {"ran": True}
