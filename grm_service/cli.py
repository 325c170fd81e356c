"""The `grm-service` command line. Every option is also an env var: GRM_<OPTION>."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from grm_service.commands.backend import exec_backend, replica_spec
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
from grm_service.engine_side.identity import compute_identity
from grm_service.engines import select_engine
from grm_service.errors import LedgerUnavailable
from grm_service.gateway.serve import run_server
from grm_service.ledger.location import check_location
from grm_service.logs import setup_logging
from grm_service.workers.manager import run_workers

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


Model = Annotated[str | None, typer.Option(help="Model folder or hub id. [env GRM_MODEL]")]
Seed = Annotated[int | None, typer.Option(help="Seed of every replica and request. [GRM_SEED]")]
Engine = Annotated[EngineName | None, typer.Option(help="Engine profile. [GRM_ENGINE]")]
Dtype = Annotated[str | None, typer.Option(help="Engine dtype. [GRM_DTYPE]")]


@app.command(context_settings=_EXTRA)
def serve(
    ctx: typer.Context,
    model: Model = None,
    replicas: Annotated[int | None, typer.Option(help="Replicas to launch. [GRM_REPLICAS]")] = None,
    seed: Seed = None,
    host: Annotated[str | None, typer.Option(help="Bind address. [GRM_HOST]")] = None,
    port: Annotated[int | None, typer.Option(help="Gateway port. [GRM_PORT]")] = None,
    workers: Annotated[
        int | None, typer.Option(help="Gateway processes on the port. [GRM_WORKERS]")
    ] = None,
    engine: Engine = None,
    gpus: Annotated[str | None, typer.Option(help="GPU ids, e.g. 0,1. [GRM_GPUS]")] = None,
    backend_url: Annotated[
        list[str] | None, typer.Option(help="Attach a running replica (repeatable).")
    ] = None,
    serialize: Annotated[SerializeMode | None, typer.Option(help="[GRM_SERIALIZE]")] = None,
    routing: Annotated[RoutingMode | None, typer.Option(help="[GRM_ROUTING]")] = None,
    dtype: Dtype = None,
    max_model_len: Annotated[int | None, typer.Option(help="[GRM_MAX_MODEL_LEN]")] = None,
    max_tokens_default: Annotated[int | None, typer.Option(help="[GRM_MAX_TOKENS_DEFAULT]")] = None,
    served_model_name: Annotated[str | None, typer.Option(help="[GRM_SERVED_MODEL_NAME]")] = None,
    work_dir: Annotated[Path | None, typer.Option(help="Logs, temp, caches.")] = None,
    launcher: Annotated[Launcher | None, typer.Option(help="[GRM_LAUNCHER]")] = None,
    ray_address: Annotated[str | None, typer.Option(help="[GRM_RAY_ADDRESS]")] = None,
    ray_placement: Annotated[RayPlacement | None, typer.Option(help="[GRM_RAY_PLACEMENT]")] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "info",
) -> None:
    """Launch N deterministic replicas behind the gateway. Extra engine args go after `--`."""
    setup_logging(log_level)
    settings = build_settings(
        model=model, replicas=replicas, seed=seed, host=host, port=port, workers=workers,
        engine=engine, gpus=gpus, backend_urls=backend_url, serialize=serialize, routing=routing,
        dtype=dtype,
        max_model_len=max_model_len, max_tokens_default=max_tokens_default,
        served_model_name=served_model_name, work_dir=work_dir, engine_args=list(ctx.args),
        launcher=launcher, ray_address=ray_address, ray_placement=ray_placement,
    )
    check_ledger(settings)
    if settings.workers > 1:
        raise typer.Exit(run_workers(settings, log_level))
    raise typer.Exit(run_server(settings, log_level))


def check_ledger(settings: Settings) -> None:
    """A ledger location that can never work refuses the start, before any replica starts: a
    service on it would answer and drop every record."""
    if not settings.ledger:
        return
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
    max_model_len: Annotated[int | None, typer.Option(help="[GRM_MAX_MODEL_LEN]")] = None,
    served_model_name: Annotated[str | None, typer.Option(help="[GRM_SERVED_MODEL_NAME]")] = None,
) -> None:
    """Print the fingerprint id, model hash and env-digest inputs a replica started with these
    settings on this host would report, without starting anything. Engine args go after `--`."""
    setup_logging("warning")
    settings = build_settings(model=model, seed=seed, engine=engine, dtype=dtype,
                              max_model_len=max_model_len, served_model_name=served_model_name,
                              engine_args=list(ctx.args))
    eng = select_engine(settings)
    # The replica's own recipe, through the same function the replica runs on itself: the id
    # printed here is the one a replica started with these settings on this host reports.
    spec = replica_spec(settings, eng)
    command = eng.command(spec, dict(os.environ))
    identity = compute_identity(command.argv, command.env, settings.cache_dir)
    out = {"fingerprint_id": identity.fingerprint_id(settings.seed), **identity.model_dump()}
    sys.stdout.write(json.dumps(out, indent=2) + "\n")


@app.command(context_settings=_EXTRA)
def backend(
    ctx: typer.Context,
    model: Model = None,
    seed: Seed = None,
    host: Annotated[str | None, typer.Option(help="Engine bind address. [GRM_HOST]")] = None,
    port: Annotated[int | None, typer.Option(help="Engine port. [GRM_PORT]")] = None,
    engine: Engine = None,
    dtype: Dtype = None,
    max_model_len: Annotated[int | None, typer.Option(help="[GRM_MAX_MODEL_LEN]")] = None,
    served_model_name: Annotated[str | None, typer.Option(help="[GRM_SERVED_MODEL_NAME]")] = None,
    work_dir: Annotated[Path | None, typer.Option(help="Replica logs and temp folders.")] = None,
) -> None:
    """Run ONE deterministic replica in the foreground (one container per GPU; attach with
    `serve --backend-url`). Extra engine args go after `--`."""
    setup_logging("info")
    exec_backend(build_settings(
        model=model, seed=seed, host=host, port=port, engine=engine, dtype=dtype,
        max_model_len=max_model_len, served_model_name=served_model_name, work_dir=work_dir,
        engine_args=list(ctx.args),
    ))


app.command("score", context_settings=_EXTRA)(score_command)
app.command("demo")(demo_command)

app.command("verify")(verify_command)
app.command("diff")(diff_command)
app.add_typer(ledger_app, name="ledger")
app.command("replay")(replay_command)


if __name__ == "__main__":
    app()
