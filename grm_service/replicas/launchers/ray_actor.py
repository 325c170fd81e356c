"""The body of one Ray replica actor: runs the engine on its node, under the reaper.

Plain Python (no Ray import), so it is testable on its own; `launchers.ray` wraps it with
`ray.remote`. The engine is started from the profile's recipe, as every launcher does; the actor
holds the write end of the reaper's lifeline: when Ray kills the actor, or its node's raylet dies,
the pipe closes and the reaper ends the engine's whole process group.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass

from grm_service.config import Settings
from grm_service.engines import ReplicaSpec, select_engine
from grm_service.replicas.child import ReapedProcess, free_port


@dataclass(frozen=True)
class Placed:
    """Where the actor's engine listens."""

    host: str
    port: int
    pid: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def node_address() -> str:
    """The address other nodes reach this one at (Ray's own view of it when Ray is running)."""
    try:
        import ray.util

        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
    except ImportError:
        return socket.gethostbyname(socket.gethostname())


class ReplicaProcess:
    """One replica's engine on this node: start, alive, tail, stop."""

    def __init__(self, settings: Settings, spec: ReplicaSpec) -> None:
        self.settings = settings
        self.spec = spec
        self.engine = select_engine(settings)
        self._proc: ReapedProcess | None = None

    def start(self, host: str | None = None) -> Placed:
        # The replica must be reachable from the gateway's node: bind this node's address.
        # No GPU ids in the spec: Ray has set CUDA_VISIBLE_DEVICES, which the env inherits.
        host = host or node_address()
        self.spec = dataclasses.replace(self.spec, port=free_port(host))
        self.spec.sweep_stale_tmp()  # a lost node's replica of this name, placed here before
        command = self.engine.command(self.spec, dict(os.environ), host)
        self._proc = ReapedProcess(command, self.spec.work_dir / "replica.log",
                                   scratch=self.spec.tmp_dir)
        self._proc.start()
        assert self._proc.pid is not None
        return Placed(host, self.spec.port, self._proc.pid)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.running()

    def tail(self) -> str:
        return self._proc.tail() if self._proc else ""

    def stop(self, grace_s: float) -> int | None:
        return self._proc.stop(grace_s) if self._proc else None
