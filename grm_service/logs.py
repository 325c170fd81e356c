"""Log lines of every grm-service process: one format, the process named where there are several."""

from __future__ import annotations

import logging
import sys


def setup_logging(level: str, process: str = "") -> None:
    """`process` names a worker process (`serve --workers N`) in each of its lines."""
    tag = f"{process} " if process else ""
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s")
    # One line per replica call would drown the lifecycle events.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
