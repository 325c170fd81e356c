"""The real command line's parser, for tests that check what a command line means (nothing is
run)."""

from __future__ import annotations

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from grm_service import cli
from grm_service.config import Settings


def command(name: str) -> TyperCommand:
    group = typer.main.get_command(cli.app)
    assert isinstance(group, TyperGroup)
    found = group.commands[name]
    assert isinstance(found, TyperCommand)
    return found


def options(name: str) -> list[TyperOption]:
    return [p for p in command(name).params
            if isinstance(p, TyperOption) and p.name != "help"]


def settings_for(name: str, argv: list[str]) -> Settings:
    """The settings `grm-service NAME ARGV` runs with, through the CLI's own parser."""
    with command(name).make_context(name, argv) as ctx:
        return cli.settings_of(ctx.params, ctx.args)
