"""The keeper's own process of `serve --workers N` (started by `workers.Manager`, not by hand).

`python -m grm_service.workers.keeper_process --run-dir D --parent PID --log-level L`, with the
settings as JSON on stdin. It keeps every replica (start or attach, admission, canaries,
restarts) and publishes the replica set to the serving workers (worker_side/snapshot.py); it
serves no request, so no request can crash it. The replicas it launched are its children and
end with it (replicas/reaper.py); it ends with the manager. SIGTERM stops the replicas: the
manager sends it once every serving worker has drained and exited. Exit code `FATAL_EXIT`: no
replica of this service could start.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from grm_service.config import Settings
from grm_service.errors import GrmError
from grm_service.gateway.role import metrics_dir, snapshot_path
from grm_service.logs import setup_logging
from grm_service.metrics import Metrics
from grm_service.replicas.credentials import probe_client
from grm_service.replicas.deployment import keeper_for
from grm_service.replicas.identity import ServiceIdentity
from grm_service.replicas.reaper import die_with_parent
from grm_service.worker_side.snapshot import Published
from grm_service.workers.manager import FATAL_EXIT

log = logging.getLogger(__name__)


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m grm_service.workers.keeper_process")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


async def keep(settings: Settings, run_dir: Path) -> int:
    """Keep and publish the replicas until SIGTERM/SIGINT; the exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)  # only record: this coroutine acts
    metrics = Metrics(metrics_dir(run_dir))
    probes = probe_client(settings)
    kept = keeper_for(settings, metrics, ServiceIdentity(settings, metrics), probes)
    published = Published(kept.keeper, snapshot_path(run_dir))
    starting = asyncio.create_task(published.start(), name="grm-keeper-start")
    stopping = asyncio.create_task(stop.wait(), name="grm-keeper-stop")
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done() and (err := starting.exception()) is not None:
            message = err.message if isinstance(err, GrmError) else repr(err)
            log.error("start-up failed: %s", message)
            return FATAL_EXIT
        if starting.done():
            log.info("keeper ready: a replica is admitted")
        await stopping
        log.info("stopping the replicas")
        return 0
    finally:
        for task in (starting, stopping):
            task.cancel()
        await published.stop()
        await kept.close()
        await probes.aclose()


def main(argv: list[str]) -> int:
    args = _args(argv)
    die_with_parent(args.parent)
    settings = Settings.model_validate_json(sys.stdin.buffer.read())
    setup_logging(args.log_level, "keeper")
    return asyncio.run(keep(settings, args.run_dir))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
