"""The `grm-service` command line. Every option is also an env var: GRM_<OPTION>."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from grm_service.commands.demo import demo_command
from grm_service.commands.ledger import ledger_app
from grm_service.commands.replay import replay_command
from grm_service.commands.score import score_command
from grm_service.commands.verify import diff_command, verify_command
from grm_service.config import (
    EngineName,
    Launcher,
    RayPlacement,
    RoutingMode,
    SerializeMode,
    Settings,
)
from grm_service.config_renames import warn_renamed
from grm_service.errors import LedgerUnavailable, ModelNotFound, WorkDirBusy
from grm_service.logs import setup_logging
from grm_service.model_source import check_model
from grm_service.work_dir import claimed

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Deterministic scoring service for reward models.")
log = logging.getLogger("grm_service")

_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}


def build_settings(**given: Any) -> Settings:
    """Flags given on the command line win; the rest come from GRM_* env vars or defaults."""
    fields = {k: v for k, v in given.items() if v is not None and v != [] and v != ()}
    try:
        return Settings(**fields)
    except ValidationError as err:
        problems = "; ".join(
            f"--{'.'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg']}" for e in err.errors()
        )
        raise typer.BadParameter(problems) from None


# Options whose name is not their settings field's, and options that are no setting at all.
FIELD_OF = {"replica_url": "replica_urls"}
CLI_ONLY = {"log_level": "GRM_LOG_LEVEL"}
# Renamed in this release, accepted for one release with a warning: old option -> new option,
# old verb -> new verb. The old options are hidden and have no env var of their own (the
# settings read the old env vars, config_renames.py).
RENAMED_OPTIONS = {"backend_url": "replica_url"}
RENAMED_VERBS = {"backend": "replica"}


def settings_of(params: Mapping[str, Any], args: Sequence[str]) -> Settings:
    """The settings of a parsed `serve`, `replica` or `fingerprint` (its context's params and
    args): its options by field name, the words after `--` as engine args."""
    params = renamed_options(params)
    given = {FIELD_OF.get(k, k): v for k, v in params.items() if k not in CLI_ONLY}
    return build_settings(**given, engine_args=list(args))


def renamed_options(params: Mapping[str, Any]) -> dict[str, Any]:
    """An old option's value under its new name (the new one, if also given, wins), warned."""
    given = dict(params)
    for old, new in RENAMED_OPTIONS.items():
        value = given.pop(old, None)
        if value:
            warn_renamed(flag(old), flag(new))
            given[new] = given.get(new) or value
    return given


def flag(param: str) -> str:
    return "--" + param.replace("_", "-")


def option(field: str, help: str) -> Any:
    """An option that is also the settings field's env var, read and shown in --help as click
    does it (typer's rich help would take a `[...]` written into the help text for markup)."""
    return typer.Option(envvar=CLI_ONLY.get(field, f"GRM_{field.upper()}"), help=help)


def check_model_source(settings: Settings) -> None:
    """A model no local engine could load is refused before any starts. Attached replicas and
    Ray's load it on their own hosts, which this one cannot see."""
    if settings.attach or settings.launcher is not Launcher.LOCAL:
        return
    try:
        check_model(settings.model, {**os.environ, **settings.engine_env}, Path.cwd())
    except ModelNotFound as err:
        raise typer.BadParameter(err.message, param_hint="'--model' (GRM_MODEL)") from None


def ledger_shown(settings: Settings) -> str:
    """Where the ledger is, for the start-up log: a URL may hold a password, a file path not."""
    if not settings.ledger:
        return "off"
    location = settings.ledger_location
    return "at GRM_LEDGER_URL (a database)" if "://" in location else location


Model = Annotated[str | None, option("model", "Model folder or hub id.")]
Seed = Annotated[int | None, option("seed", "Seed of every replica and request.")]
Engine = Annotated[EngineName | None, option("engine", "Engine profile.")]
Dtype = Annotated[str | None, option("dtype", "Engine dtype.")]
MaxModelLen = Annotated[int | None, option("max_model_len", "Engine context length.")]
ServedName = Annotated[str | None, option("served_model_name",
                                          "Name clients send as `model` (default: --model).")]
LogLevel = Annotated[str, option("log_level", "Logging level.")]


@app.command(context_settings=_EXTRA)
def serve(
    ctx: typer.Context,
    model: Model = None,
    replicas: Annotated[int | None, option("replicas", "Replicas to launch.")] = None,
    seed: Seed = None,
    host: Annotated[str | None, option("host", "Bind address.")] = None,
    port: Annotated[int | None, option("port", "Gateway port.")] = None,
    workers: Annotated[int | None, option("workers", "Gateway processes on the port.")] = None,
    engine: Engine = None,
    gpus: Annotated[str | None, option("gpus", "GPU ids, e.g. 0,1.")] = None,
    replica_url: Annotated[list[str] | None, option(
        "replica_urls", "Attach a running replica (repeatable; the env var comma-separated).")
    ] = None,
    backend_url: Annotated[list[str] | None, typer.Option(
        hidden=True, help="Deprecated: --replica-url.")] = None,
    serialize: Annotated[SerializeMode | None, option(
        "serialize", "One in-flight request per replica.")] = None,
    routing: Annotated[RoutingMode | None, option("routing", "Replica choice.")] = None,
    dtype: Dtype = None,
    max_model_len: MaxModelLen = None,
    max_tokens_default: Annotated[int | None, option(
        "max_tokens_default", "max_tokens of a request that sets none.")] = None,
    served_model_name: ServedName = None,
    work_dir: Annotated[Path | None, option(
        "work_dir", "Replica logs, temp folders, the ledger (default: a folder of its own "
        "below ~/.cache/grm-service/run).")] = None,
    launcher: Annotated[Launcher | None, option("launcher", "Where replicas run.")] = None,
    ray_address: Annotated[str | None, option("ray_address", "Ray cluster address.")] = None,
    ray_placement: Annotated[RayPlacement | None, option(
        "ray_placement", "Replicas over Ray nodes.")] = None,
    log_level: LogLevel = "info",
) -> None:
    """Launch N deterministic replicas behind the gateway. Extra engine args go after `--`
    (or in GRM_ENGINE_ARGS); every other setting is a GRM_* env var (README)."""
    setup_logging(log_level)
    settings = settings_of(ctx.params, ctx.args)
    check_model_source(settings)
    # The server's modules only now: a refused setting is said before a second of imports.
    from grm_service.gateway.serve import run_server
    from grm_service.workers.manager import run_workers

    try:
        with claimed(settings, os.getpid()) as mine:
            log.info("work dir %s (replica logs); ledger %s", mine.work_dir, ledger_shown(mine))
            check_ledger(mine)
            code = (run_workers(mine, log_level) if mine.workers > 1
                    else run_server(mine, log_level))
    except WorkDirBusy as err:
        raise typer.BadParameter(err.message, param_hint="'--work-dir' (GRM_WORK_DIR)") from None
    raise typer.Exit(code)


def check_ledger(settings: Settings) -> None:
    """A ledger location that can never work refuses the start, before any replica starts: a
    service on it would answer and drop every record."""
    if not settings.ledger:
        return
    from grm_service.ledger.location import check_location

    try:
        check_location(settings.ledger_location)
    except LedgerUnavailable as err:
        log.error("start-up refused: %s", err.message)
        raise typer.Exit(2) from None


@app.command(context_settings=_EXTRA)
def fingerprint(
    ctx: typer.Context,
    model: Model = None,
    seed: Seed = None,
    engine: Engine = None,
    dtype: Dtype = None,
    max_model_len: MaxModelLen = None,
    served_model_name: ServedName = None,
) -> None:
    """Print the fingerprint id, model hash and env-digest inputs a replica started with these
    settings on this host would report, without starting anything. Engine args go after `--`."""
    from grm_service.commands.replica import replica_identity

    setup_logging("warning")
    settings = settings_of(ctx.params, ctx.args)
    identity = replica_identity(settings)
    out = {"fingerprint_id": identity.fingerprint_id(settings.seed), **identity.model_dump()}
    sys.stdout.write(json.dumps(out, indent=2) + "\n")


def replica(
    ctx: typer.Context,
    model: Model = None,
    seed: Seed = None,
    host: Annotated[str | None, option("host", "Engine bind address.")] = None,
    port: Annotated[int | None, option("port", "Engine port.")] = None,
    engine: Engine = None,
    dtype: Dtype = None,
    max_model_len: MaxModelLen = None,
    served_model_name: ServedName = None,
    work_dir: Annotated[Path | None, option(
        "work_dir", "Replica logs and temp folders.")] = None,
) -> None:
    """Run ONE deterministic replica in the foreground (one container per GPU; attach with
    `serve --replica-url`). Extra engine args go after `--`."""
    setup_logging("info")
    if ctx.info_name in RENAMED_VERBS:
        warn_renamed(f"grm-service {ctx.info_name}", f"grm-service {RENAMED_VERBS[ctx.info_name]}")
    settings = settings_of(ctx.params, ctx.args)
    check_model_source(settings)
    from grm_service.commands.replica import exec_replica  # after the check, as serve's

    exec_replica(settings)


app.command("replica", context_settings=_EXTRA)(replica)
for _old in RENAMED_VERBS:
    app.command(_old, context_settings=_EXTRA, hidden=True)(replica)


app.command("score", context_settings=_EXTRA)(score_command)
app.command("demo")(demo_command)

app.command("verify")(verify_command)
app.command("diff")(diff_command)
app.add_typer(ledger_app, name="ledger")
app.command("replay")(replay_command)


if __name__ == "__main__":
    app()
