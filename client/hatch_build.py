"""Puts the client's modules into its distributions: the repository's own grm_service/ files,
never a copy that could drift. Built from the repository, they are read from ../grm_service;
built from the sdist, from the sdist's grm_service/ (where the sdist build put them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class ClientModules(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        base = root if (root / "grm_service").is_dir() else root.parent
        for module in self.config["modules"]:
            build_data["force_include"][str(base / module)] = module
