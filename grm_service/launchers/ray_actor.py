"""The body of one Ray replica actor: runs the engine on its node, under the reaper.

Plain Python (no Ray import), so it is testable on its own; `launchers.ray` wraps it with
`ray.remote`. The actor holds the write end of the reaper's lifeline: when Ray kills the actor,
or its node's raylet dies, the pipe closes and the reaper ends the engine's whole process group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass

from grm_service.config import Settings
from grm_service.engines import ReplicaSpec, select_engine
from grm_service.supervisor import log_tail


@dataclass(frozen=True)
class Placed:
    """Where the actor's engine listens, and what it runs."""

    host: str
    port: int
    pid: int
    engine_version: str

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
    """One replica's engine on this node: start, alive, log_tail, stop."""

    def __init__(self, settings: Settings, spec: ReplicaSpec) -> None:
        self.settings = settings
        self.spec = spec
        self.engine = select_engine(settings)
        self._proc: subprocess.Popen[bytes] | None = None
        self._lifeline: int | None = None

    @property
    def log_path(self) -> str:
        return str(self.spec.work_dir / "replica.log")

    def command(self, host: str) -> tuple[list[str], dict[str, str]]:
        """The profile's argv and env, as the Supervisor builds them. No GPU ids in the spec:
        Ray has already set CUDA_VISIBLE_DEVICES to this actor's GPUs, which the env inherits."""
        # The profile binds loopback; a Ray replica must be reachable from the gateway's node,
        # and the engine's argparse keeps the last --host.
        argv = [*self.engine.argv(self.spec), "--host", host]
        argv[0] = sys.executable  # this node's interpreter, not the gateway's path
        env = {**os.environ, **self.engine.deterministic_env(), **self.settings.engine_env,
               **self.engine.replica_env(self.spec)}
        return argv, env

    def start(self, host: str | None = None) -> Placed:
        host = host or node_address()
        self.spec = dataclasses.replace(self.spec, port=free_port_on(host))
        for sub in ("tmp", "vllm-cache"):
            (self.spec.work_dir / sub).mkdir(parents=True, exist_ok=True)
        argv, env = self.command(host)
        read_end, self._lifeline = os.pipe()
        with open(self.log_path, "ab") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "grm_service.reaper", "--lifeline", str(read_end), "--",
                 *argv], env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(read_end,),
            )
        os.close(read_end)
        return Placed(host, self.spec.port, self._proc.pid, self.engine.version())

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def tail(self) -> str:
        return log_tail(self.spec.work_dir / "replica.log")

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the group, wait up to grace, SIGKILL the group, reap."""
        if self._proc is None:
            return None
        self._signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(grace_s)
        self._signal(signal.SIGKILL)
        code = self._proc.wait()
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        return code

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, sig)


def free_port_on(host: str) -> int:
    """A free port on this node's interface `host`, where the engine will listen."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
