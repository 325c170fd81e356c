"""vLLM general plugin: one top-k/top-p sampling path at every batch size (issue 8).

With ``VLLM_BATCH_INVARIANT=1`` and a per-request seed, vLLM's model numbers do not depend on
the batch, but some releases filter top-k/top-p with a PyTorch sort when the batch has fewer than
8 rows and with a Triton kernel at 8 or more. The two disagree at the nucleus edge, so a seeded
request with ``top_p < 1`` can sample a different token when it shares a step with others
(3 of 32 texts on an H200). Sending every call to the Triton kernel closes that hole; sending
every call to the sort does not (the sort itself is not batch-invariant).

What each known release needs, read from its source (``vllm/v1/sample/ops/topk_topp_sampler.py``):

* 0.25.0 - 0.29.0: two paths, split at 8 rows -> patch. Modules that import the function by
  name: ``v1.sample.rejection_sampler``, ``v1.worker.gpu.sample.states``,
  ``v1.worker.gpu.sample.sampler`` and, from 0.27.0, ``model_executor.models.diffusion_gemma``.
* 0.30.0 - 0.33.0: upstream already calls the Triton kernel whenever Triton is present -> nothing.

An unknown release with batch invariance on stops vLLM's start-up with :class:`PluginError`;
``GRM_VLLM_PLUGIN=force`` patches anyway, ``GRM_VLLM_PLUGIN=off`` runs without the plugin.

The plugin acts only in replicas grm-service started: their engine profile sets
``GRM_SERVICE_REPLICA=1`` in the child's environment. Installing grm-service next to a trainer (for
its reward adapters) registers the entry point for the trainer's own rollout engines too; there,
whatever the vLLM version or environment, the plugin does nothing and says nothing.

vLLM loads this module in every process it starts (API server, engine core, TP workers), so it
must import nothing but the standard library at module level.
"""

from __future__ import annotations

import enum
import importlib
import importlib.metadata
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, ModuleType
from typing import Any

from grm_service.engine_side import header_cache, worker_poll

logger = logging.getLogger(__name__)

PLUGIN_NAME = "grm_service"  # the entry-point name; VLLM_PLUGINS must list it when set
SWITCH_ENV = "GRM_VLLM_PLUGIN"
BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"
PLUGINS_ENV = "VLLM_PLUGINS"
# Set to "1" by grm-service's engine profiles in each replica's environment, and nowhere else.
REPLICA_ENV = "GRM_SERVICE_REPLICA"

SAMPLER_MODULE = "vllm.v1.sample.ops.topk_topp_sampler"
FUNCTION = "apply_top_k_top_p"
TRITON_FUNCTION = "apply_top_k_top_p_triton"
_PARAMETERS = ("logits", "k", "p")
_MARK = "__grm_single_path__"


class PluginError(RuntimeError):
    """Raised from :func:`register`; vLLM does not catch it, so start-up stops with this text."""


class Mode(enum.StrEnum):
    """Value of ``GRM_VLLM_PLUGIN``."""

    AUTO = "auto"
    OFF = "off"
    FORCE = "force"


class Sampling(enum.Enum):
    """How a vLLM release routes top-k/top-p on CUDA."""

    SPLIT_AT_8_ROWS = "split"
    TRITON_ALWAYS = "triton"


class Action(enum.StrEnum):
    PATCH = "patch"
    SKIP = "skip"


KNOWN_VERSIONS: Mapping[str, Sampling] = MappingProxyType(
    {
        **dict.fromkeys(
            ("0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0"),
            Sampling.SPLIT_AT_8_ROWS,
        ),
        **dict.fromkeys(("0.30.0", "0.31.0", "0.32.0", "0.33.0"), Sampling.TRITON_ALWAYS),
    }
)


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


def decide(
    env: Mapping[str, str],
    vllm_version: Callable[[], str | None],
    is_cuda: Callable[[], bool],
) -> Decision:
    """Say what the plugin does; the callables run only when needed (they import vLLM)."""
    if not is_replica(env):
        return Decision(Action.SKIP, f"not a grm-service replica ({REPLICA_ENV} unset)")
    mode = _mode(env)
    if mode is Mode.OFF:
        return Decision(Action.SKIP, f"disabled by {SWITCH_ENV}=off")
    if not _batch_invariant(env):
        return Decision(Action.SKIP, f"{BATCH_INVARIANT_ENV} is off: sampling is not invariant")
    version = vllm_version()
    if version is None:
        return Decision(Action.SKIP, "vllm is not installed")
    if not is_cuda():
        return Decision(Action.SKIP, "platform is not CUDA")
    return _decide_for_version(version, mode)


def _decide_for_version(version: str, mode: Mode) -> Decision:
    # A local tag (+cu130, +cpu) names a build of the same source.
    sampling = KNOWN_VERSIONS.get(version.split("+", 1)[0])
    if sampling is Sampling.TRITON_ALWAYS:
        return Decision(Action.SKIP, f"vLLM {version} already uses the Triton kernel always")
    if sampling is Sampling.SPLIT_AT_8_ROWS:
        return Decision(Action.PATCH, f"vLLM {version} switches sampling path at 8 rows")
    if mode is Mode.FORCE:
        return Decision(Action.PATCH, f"vLLM {version} is unknown; forced by {SWITCH_ENV}=force")
    raise PluginError(
        f"grm_service vLLM plugin: vLLM {version} is not a known version "
        f"(known: {', '.join(KNOWN_VERSIONS)}), and with {BATCH_INVARIANT_ENV}=1 its top-k/top-p "
        f"sampling may not be batch-invariant. Check {SAMPLER_MODULE}.{FUNCTION} in that release, "
        f"then set {SWITCH_ENV}=force to patch it anyway or {SWITCH_ENV}=off to run without "
        "the patch."
    )


def is_replica(env: Mapping[str, str]) -> bool:
    """Whether this process is a replica grm-service started (the engine profile's marker)."""
    return env.get(REPLICA_ENV) == "1"


def _mode(env: Mapping[str, str]) -> Mode:
    raw = env.get(SWITCH_ENV, Mode.AUTO.value).strip().lower() or Mode.AUTO.value
    try:
        return Mode(raw)
    except ValueError:
        allowed = "|".join(m.value for m in Mode)
        raise PluginError(f"{SWITCH_ENV} must be one of {allowed}, got {raw!r}") from None


def _batch_invariant(env: Mapping[str, str]) -> bool:
    # Parsed as vLLM parses it (bool(int(...))); vLLM itself rejects a non-integer.
    try:
        return int(env.get(BATCH_INVARIANT_ENV, "0")) != 0
    except ValueError:
        return False


def apply_patch(
    import_module: Callable[[str], ModuleType] = importlib.import_module,
    loaded_modules: Callable[[], Iterable[tuple[str, ModuleType]]] | None = None,
) -> list[str]:
    """Route every top-k/top-p call to the Triton kernel; return the modules rebound.

    Modules imported later read the patched name from the sampler module, so only the ones
    already loaded need rebinding. Idempotent: a second call finds the patch and returns [].
    """
    sampler = import_module(SAMPLER_MODULE)
    original = getattr(sampler, FUNCTION, None)
    if not callable(original):
        raise PluginError(f"{SAMPLER_MODULE} has no {FUNCTION}; this vLLM needs a new recipe")
    if getattr(original, _MARK, False):
        return []
    _check_signature(original)
    kernel = getattr(sampler, TRITON_FUNCTION, None)
    if not callable(kernel):
        raise PluginError(f"{SAMPLER_MODULE}.{TRITON_FUNCTION} is missing: is Triton installed?")
    replacement = _single_path(kernel)
    modules = loaded_modules() if loaded_modules is not None else _loaded_vllm_modules()
    rebound = [name for name, module in modules if _rebind(module, original, replacement)]
    if getattr(sampler, FUNCTION) is not replacement:
        raise PluginError(f"could not rebind {SAMPLER_MODULE}.{FUNCTION}")
    return rebound


def _check_signature(function: Callable[..., Any]) -> None:
    names = tuple(inspect.signature(function).parameters)
    if names != _PARAMETERS:
        raise PluginError(
            f"{SAMPLER_MODULE}.{FUNCTION} takes {names}, expected {_PARAMETERS}: "
            "this vLLM needs a new recipe"
        )


def _single_path(kernel: Callable[..., Any]) -> Callable[..., Any]:
    def apply_top_k_top_p(logits: Any, k: Any, p: Any) -> Any:
        # vLLM's contract: with no filter the logits come back untouched.
        if k is None and p is None:
            return logits
        return kernel(logits, k, p)

    setattr(apply_top_k_top_p, _MARK, True)
    return apply_top_k_top_p


def _rebind(module: ModuleType, original: object, replacement: object) -> bool:
    # By identity, so an alias (`import ... as f`) is caught and an unrelated name is not.
    names = [name for name, value in list(vars(module).items()) if value is original]
    for name in names:
        setattr(module, name, replacement)
    return bool(names)


def _loaded_vllm_modules() -> list[tuple[str, ModuleType]]:
    # Only vLLM's own modules: touching others' __dict__ can trigger lazy loaders.
    return [
        (name, module)
        for name, module in list(sys.modules.items())
        if (name == "vllm" or name.startswith("vllm.")) and isinstance(module, ModuleType)
    ]


def is_active() -> bool:
    """Whether this process already samples through the patched function (imports nothing)."""
    sampler = sys.modules.get(SAMPLER_MODULE)
    return bool(getattr(getattr(sampler, FUNCTION, None), _MARK, False))


def installed_vllm_version() -> str | None:
    # Inside vLLM's processes vllm is loaded and its own version string is the authority;
    # elsewhere read the metadata, since importing vllm rewrites os.environ (env_override).
    loaded = sys.modules.get("vllm")
    if loaded is not None and hasattr(loaded, "__version__"):
        return str(loaded.__version__)
    for distribution in importlib.metadata.packages_distributions().get("vllm", []):
        return importlib.metadata.version(distribution)
    return None


def platform_is_cuda() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda())


def register() -> None:
    """Entry point of ``vllm.general_plugins``; vLLM calls it once in each of its processes."""
    if not is_replica(os.environ):
        return  # someone else's vLLM (a trainer's rollout engine): leave it exactly as it is
    polling = worker_poll.install(os.environ, installed_vllm_version())
    logger.info("grm_service vLLM plugin (pid %d): %s; %s", os.getpid(), polling,
                header_cache.share(os.environ))
    decision = decide(os.environ, installed_vllm_version, platform_is_cuda)
    if decision.action is Action.SKIP:
        logger.info("grm_service vLLM plugin idle (pid %d): %s", os.getpid(), decision.reason)
        return
    rebound = apply_patch()
    logger.info(
        "grm_service vLLM plugin: top-k/top-p uses the Triton kernel at every batch size "
        "(pid %d, %s; rebound %s)",
        os.getpid(),
        decision.reason,
        ", ".join(rebound) or "nothing new",
    )


def status(env: Mapping[str, str] | None = None, *, cuda: bool | None = None) -> dict[str, str]:
    """What the plugin does under ``env`` (default: this process's), for fingerprints.

    A gateway that launches vLLM passes the child's env and ``cuda`` (which engine it starts);
    without ``cuda`` the platform is asked of vLLM, which imports it. Never raises: a decision
    that would stop vLLM is reported as ``decision: error``.
    """
    env = os.environ if env is None else env
    is_cuda = platform_is_cuda if cuda is None else _fixed(cuda)
    report = {
        "plugin": __name__,
        "mode": env.get(SWITCH_ENV, Mode.AUTO.value),
        "vllm": installed_vllm_version() or "absent",
        "active": "yes" if is_active() else "no",
    }
    if not _listed_in_vllm_plugins(env):
        return report | {"decision": "not-loaded", "reason": f"{PLUGINS_ENV} omits {PLUGIN_NAME}"}
    try:
        decision = decide(env, installed_vllm_version, is_cuda)
    except PluginError as error:
        return report | {"decision": "error", "reason": str(error)}
    return report | {"decision": decision.action.value, "reason": decision.reason}


def _fixed(value: bool) -> Callable[[], bool]:
    return lambda: value


def _listed_in_vllm_plugins(env: Mapping[str, str]) -> bool:
    raw = env.get(PLUGINS_ENV)
    return raw is None or PLUGIN_NAME in {name.strip() for name in raw.split(",")}
