"""`grm-service replica`: run ONE engine replica in the foreground, for one container per GPU.

The replica is started from the same recipe as every other (the engine profile's argv, env and
folders, identity middleware included), and then this process *becomes* the engine (exec), so a
container's PID 1 chain is the engine itself: signals reach it directly and its exit is the
container's exit. A gateway in attach mode (`grm-service serve --replica-url ...`) reads the
identity the replica computes itself and runs the canary before routing to it.
"""

from __future__ import annotations

import logging
import os
from typing import NoReturn

from grm_service.config import Settings
from grm_service.engine_side.identity import ReplicaIdentity, compute_identity
from grm_service.engines import ChildCommand, Engine, ReplicaSpec, select_engine

log = logging.getLogger(__name__)


def replica_spec(settings: Settings, engine: Engine) -> ReplicaSpec:
    """Replica 0 of one: its own work dir, the engine's first GPU set (the container's GPU)."""
    return ReplicaSpec(name="r0", index=0, port=settings.port, work_dir=settings.work_dir / "r0",
                       gpus=engine.gpu_set(0))


def replica_identity(settings: Settings) -> ReplicaIdentity:
    """What a replica started with these settings on this host will report, nothing started:
    its own recipe, through the same function the replica runs on itself."""
    engine = select_engine(settings)
    command = engine.command(replica_spec(settings, engine), dict(os.environ))
    return compute_identity(command.argv, command.env, settings.cache_dir)


def replica_command(settings: Settings, base_env: dict[str, str]) -> ChildCommand:
    """The replica's recipe, bound to the container's own interface (`--host`)."""
    engine = select_engine(settings)
    spec = replica_spec(settings, engine)
    for path in spec.sweep_stale_tmp():
        log.info("removed %s, left by an earlier replica of this work dir", path)
    command = engine.command(spec, base_env, settings.host)
    command.make_dirs()
    return command


def exec_replica(settings: Settings) -> NoReturn:
    command = replica_command(settings, dict(os.environ))
    log.info("exec replica on %s:%d: %s", settings.host, settings.port, " ".join(command.argv))
    logging.shutdown()  # exec discards this process's buffers
    os.execve(command.argv[0], command.argv, command.env)
