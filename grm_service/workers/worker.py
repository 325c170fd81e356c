"""One gateway worker process of `serve --workers N` (started by `workers.Manager`, not by hand).

`python -m grm_service.workers.worker --index I --run-dir D --listen-fd F --parent PID ...`, with
the settings as JSON on stdin (a pipe: they may hold API keys). The worker serves the app on the
listening socket it was given, answers the manager's liveness pings on `--ping-fd`, and ends with
its parent.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from grm_service.config import Settings
from grm_service.gateway.role import WorkerRole
from grm_service.gateway.serve import run_server
from grm_service.logs import setup_logging
from grm_service.replicas.reaper import die_with_parent
from grm_service.workers.manager import FATAL_EXIT


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m grm_service.workers.worker")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--ping-fd", type=int, default=None)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = _args(argv)
    die_with_parent(args.parent)
    settings = Settings.model_validate_json(sys.stdin.buffer.read())
    role = WorkerRole(index=args.index, count=settings.workers, run_dir=args.run_dir,
                      listen_fd=args.listen_fd, ping_fd=args.ping_fd)
    setup_logging(args.log_level, f"w{args.index}")
    logging.getLogger(__name__).info("worker %d of %d serving", role.index, role.count)
    return FATAL_EXIT if run_server(settings, args.log_level, role) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
