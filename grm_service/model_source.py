"""The model a service is asked to serve, checked before any engine starts.

An engine given a folder that does not exist reads it as a hub id and fails a minute into its
start (`OSError: Repo id must be in the form 'repo_name'...`); one given a hub id it cannot fetch
fails as late. Both are known in well under a second from here: a value that looks like a path
must be an existing folder, and a hub id must be in the local hub cache or answered by the hub.
Only what the engine would do is checked, in the environment it would get: `HF_HUB_OFFLINE`,
`HF_ENDPOINT`, `HF_HUB_CACHE` / `HF_HOME` and `HF_TOKEN` are read from that mapping, never from
this process.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from grm_service.errors import ModelNotFound

HUB = "https://huggingface.co"
# The hub's own rule (huggingface_hub's validate_repo_id): `name` or `namespace/name`.
_HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?", re.ASCII)
_TRUE = {"1", "true", "yes", "on"}


def looks_like_path(model: str, cwd: Path) -> bool:
    """`/x`, `./x`, `../x`, `~/x`, or a relative path whose first folder exists here: the user
    meant a folder, whatever a hub id of that spelling would be."""
    if model.startswith(("/", ".", "~")):
        return True
    first = Path(model).parts[0] if Path(model).parts else ""
    return bool(first) and (cwd / first).exists()


def check_model(model: str, env: Mapping[str, str], cwd: Path, timeout_s: float = 10.0) -> None:
    """Raise ModelNotFound, naming the value and what to do, where no engine could load it."""
    folder = cwd / Path(model).expanduser()
    if folder.is_dir():
        return
    if looks_like_path(model, cwd):
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        where = "" if str(folder) == model else f" ({folder})"
        raise ModelNotFound(
            f"{model!r}{where} {what}. Give the folder that holds the model (its config.json "
            "and weights), or a hub id such as Qwen/Qwen2-VL-2B-Instruct")
    if env.get("VLLM_USE_MODELSCOPE", "").lower() in _TRUE:
        return  # a ModelScope id: another hub, which the engine reaches its own way
    check_hub_id(model, env, timeout_s)


def hub_cache(env: Mapping[str, str]) -> Path:
    """Where the engine's hub client looks for downloaded models, in its environment."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or str(Path(env.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return Path(home).expanduser() / "hub"


def in_cache(model: str, cache: Path) -> bool:
    """A snapshot of the repo in the hub cache (its documented layout), which the engine loads
    without the hub."""
    snapshots = cache / f"models--{model.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())


def check_hub_id(model: str, env: Mapping[str, str], timeout_s: float) -> None:
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    except ImportError:
        return  # no engine is installed here to fetch it either
    if not _HUB_ID.fullmatch(model):
        raise _not_a_hub_id(model)
    cache = hub_cache(env)
    if in_cache(model, cache):
        return
    endpoint = env.get("HF_ENDPOINT") or HUB
    if env.get("HF_HUB_OFFLINE", "").lower() in _TRUE:
        raise ModelNotFound(
            f"{model!r} is not in the hub cache ({cache}) and HF_HUB_OFFLINE is set: "
            f"download it first where the hub can be reached (hf download {model}), or give "
            "the model's folder")
    try:
        HfApi(endpoint=endpoint).model_info(model, timeout=timeout_s,
                                            token=env.get("HF_TOKEN") or None)
    except GatedRepoError:
        raise ModelNotFound(
            f"{model!r} is gated on {endpoint}: ask for access on its page, then set "
            "HF_TOKEN (or `hf auth login`)") from None
    except ValueError:  # the hub client's own check of the id, stricter than ours
        raise _not_a_hub_id(model) from None
    except RepositoryNotFoundError:
        raise ModelNotFound(
            f"{model!r}: no such model on {endpoint} (or a private one: set HF_TOKEN "
            "or `hf auth login`), and no folder of that name here") from None
    # The hub client raises requests', httpx' or its own transport errors by version: every
    # failure to get an answer means the engine could not fetch the model either.
    except Exception as err:
        raise ModelNotFound(
            f"{model!r} is not in the hub cache ({cache}) and the hub at {endpoint} "
            f"cannot be reached ({type(err).__name__}: {err}): download it where the hub can "
            "be reached and give its folder, or fix the network (HF_ENDPOINT for a mirror)"
        ) from None


def _not_a_hub_id(model: str) -> ModelNotFound:
    return ModelNotFound(f"{model!r} is neither an existing folder nor a hub id (namespace/name):"
                         " give the model's folder, or its hub id")
