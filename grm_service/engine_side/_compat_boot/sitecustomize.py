"""Runs `grm_service.engine_side.compat.install()` at interpreter start-up of vLLM's processes.

The engine profile prepends this folder to PYTHONPATH of every vLLM child, and Python imports
`sitecustomize` from the first folder on sys.path that has one, so the hooks reach the API
server and everything it spawns (engine core, workers) without touching the user's venv.
compat.py is loaded by file path because grm_service need not be installed where vLLM runs,
and any other `sitecustomize` that this one shadows (e.g. a distribution's) still runs.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_COMPAT_MODULE = "_grm_service_compat"


def _install_compat_hooks() -> None:
    spec = importlib.util.spec_from_file_location(_COMPAT_MODULE, _HERE.parent / "compat.py")
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[_COMPAT_MODULE] = module
    spec.loader.exec_module(module)
    module.install()


def _run_shadowed_sitecustomize() -> None:
    others = [entry for entry in sys.path if Path(entry or ".").resolve() != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_install_compat_hooks()
_run_shadowed_sitecustomize()
