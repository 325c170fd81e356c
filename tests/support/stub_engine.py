"""The STUB backend as an engine profile, for tests of the keeper and its sources (the gateway
is the thing under test): a replica that comes up at once and runs no model."""

from __future__ import annotations

import sys
from collections.abc import Mapping

from grm_service.engines import Capabilities, ChildCommand, Engine, ReplicaSpec


class StubEngine(Engine):
    name = "stub"
    distribution = "grm-service"

    def capabilities(self, version: str | None = None,
                     env: Mapping[str, str] | None = None) -> Capabilities:
        return Capabilities(False, False, "stub")

    def argv(self, spec: ReplicaSpec, host: str) -> list[str]:
        return [sys.executable, "-m", "grm_service.testing.stub_openai", "--port", str(spec.port)]

    def deterministic_env(self) -> dict[str, str]:
        return {}

    def replica_env(self, spec: ReplicaSpec) -> dict[str, str]:
        return {}

    def command(self, spec: ReplicaSpec, base_env: Mapping[str, str],
                host: str = "127.0.0.1") -> ChildCommand:
        return ChildCommand(self.argv(spec, host), dict(base_env), (spec.work_dir,))
