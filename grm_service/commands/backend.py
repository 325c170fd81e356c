"""`grm-service backend`: run ONE engine replica in the foreground, for one container per GPU.

The replica gets exactly what a supervised replica gets (the engine profile's argv, deterministic
env and placement env) and then this process *becomes* the engine (exec), so a container's PID 1
chain is the engine itself: signals reach it directly and its exit is the container's exit.
A gateway in attach mode (`grm-service serve --backend-url ...`) checks each such replica's
identity before routing to it; the start-up canary belongs to that admission step
(`attach.AdmissionCheck`), since nothing of grm-service runs here once the engine starts.
"""

from __future__ import annotations

import logging
import os
from typing import NoReturn

from grm_service.config import Settings
from grm_service.engines import Engine, ReplicaSpec, select_engine

log = logging.getLogger(__name__)


def replica_spec(settings: Settings, engine: Engine) -> ReplicaSpec:
    """Replica 0 of one: its own work dir, the engine's first GPU set (the container's GPU)."""
    return ReplicaSpec(name="r0", index=0, port=settings.port, work_dir=settings.work_dir / "r0",
                       gpus=engine.gpu_set(0))


def backend_command(
    settings: Settings, base_env: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The argv and env of the replica, in the order the Supervisor layers them."""
    engine = select_engine(settings)
    spec = replica_spec(settings, engine)
    # Profiles bind loopback (their replicas sit behind a local gateway); a container's replica
    # must listen on its own interface. The engine's argparse keeps the last --host.
    argv = [*engine.argv(spec), "--host", settings.host]
    env = {**base_env, **engine.deterministic_env(), **settings.engine_env,
           **engine.replica_env(spec)}
    for sub in ("tmp", "vllm-cache"):
        (spec.work_dir / sub).mkdir(parents=True, exist_ok=True)
    return argv, env


def exec_backend(settings: Settings) -> NoReturn:
    argv, env = backend_command(settings, dict(os.environ))
    log.info("exec replica on %s:%d: %s", settings.host, settings.port, " ".join(argv))
    logging.shutdown()  # exec discards this process's buffers
    os.execve(argv[0], argv, env)
