"""One precompiled C++ header for every CPU replica, kept with the shared inductor cache.

On CPU, the kernels vLLM compiles at a replica's first request (the sampler's and the rank count
of logprobs, with --enforce-eager too) build on a precompiled ATen header: 150 MB, about 7 s of
g++. torch keeps that header under its *default* cache folder (`torchinductor_<user>` in the temp
dir), not under `TORCHINDUCTOR_CACHE_DIR` where the kernels go, and a replica's temp dir is its
own (its IPC sockets live there): every start built the header again. A link from that folder to
the shared inductor cache lets every later start find it (torch keys the header on its compiler,
flags and the preprocessed source, and locks what it writes).

Leans on torch's `default_cache_dir` (`torch._inductor.runtime.cache_dir_utils`), looked up here
at each replica's start: without it, or with a real folder already in its place, the header is
built per start as before, and the plugin's log line says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def torch_default_cache_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return str(default_cache_dir())


def share(env: Mapping[str, str],
          default_dir: Callable[[], str] = torch_default_cache_dir) -> str:
    """Link torch's default cache folder to the replica's inductor cache; what was done."""
    shared = env.get(INDUCTOR_CACHE_ENV)
    if not shared:
        return "header cache: no shared inductor cache set"
    try:
        link = Path(default_dir())
    except (ImportError, AttributeError) as err:
        return f"header cache: torch's default cache folder unknown ({err}): built per start"
    try:
        return _link(link, Path(shared))
    except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop; never stop vLLM
        return f"header cache: cannot link {link} ({err}): built per start"


def _link(link: Path, target: Path) -> str:
    if link.resolve() == target.resolve():
        return f"header cache: {link} is the shared one"
    link.parent.mkdir(parents=True, exist_ok=True)
    try:
        link.symlink_to(target, target_is_directory=True)
    except FileExistsError:
        # This replica's other processes call this too; the first one's link serves them all.
        if link.resolve() == target.resolve():
            return f"header cache: {link} -> {target}"
        return f"header cache: {link} exists and is not a link to {target}: built per start"
    return f"header cache: {link} -> {target}"
