"""The start-up check of the uvicorn internals the edge's protocol uses, and the choice of
protocol it leads to.

`protocol.py` subclasses uvicorn's private httptools protocol: it reads attributes uvicorn sets
per connection and per request, and overrides parser callbacks (it builds none of uvicorn's
cycles: the hot exchange never hands a request back to uvicorn). pyproject bounds uvicorn's
version; this check is for an install outside the bound, or a release inside it that changed
them. It builds a real protocol on a stand-in transport and looks for each name, so a renamed
attribute is found before the first request:

- all present: `HotHttpProtocol` (the one-write exchange and the edge's limits);
- the exchange's needs missing: `EdgeProtocol` (limits only; the hot routes go through ASGI);
- the parser callbacks or connection attributes missing: uvicorn's own `HttpToolsProtocol`,
  whose keep-alive timeout and `limit_concurrency` are then the only limits.

Either fallback says so in one log line.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from grm_service.gateway.edge.protocol import EdgeProtocol, HotHttpProtocol
from grm_service.gateway.service import Service

log = logging.getLogger(__name__)

# What EdgeProtocol calls, reads or sets on uvicorn's protocol (it makes the per-request
# `url`, `headers` and `expect_100_continue` itself, for uvicorn's cycle to read).
EDGE_NEEDS = ("connection_made", "connection_lost", "data_received", "on_message_begin",
              "on_headers_complete", "on_body", "on_message_complete", "on_response_complete",
              "transport", "headers", "parser", "scope", "server_state", "ws_protocol_class",
              "flow", "pipeline", "_start_asgi_task", "url", "expect_100_continue")
# What the one-write exchange reads besides.
HOT_NEEDS = ("app", "cycle", "tasks", "loop", "access_log", "root_path")


class _Transport(asyncio.Transport):
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 0), "peername": ("127.0.0.1", 0)}.get(name, default)


async def _noop(scope: Any, receive: Any, send: Any) -> None:
    return None


def missing(protocol: type[HttpToolsProtocol] = HttpToolsProtocol
            ) -> tuple[list[str], list[str]]:
    """(what EdgeProtocol needs and is missing, what the exchange needs and is missing)."""
    loop = asyncio.new_event_loop()
    try:
        config = uvicorn.Config(_noop, log_config=None, lifespan="off", ws="none")
        proto = protocol(config, ServerState(), {}, loop)
        proto.connection_made(_Transport())
        proto.on_message_begin()
        edge = [name for name in EDGE_NEEDS if not hasattr(proto, name)]
        hot = [name for name in HOT_NEEDS if not hasattr(proto, name)]
    except Exception as err:  # a changed constructor or callback: nothing of ours fits
        return [f"{protocol.__name__}: {err!r}"], []
    finally:
        loop.close()
    return edge, hot


def protocol_for(service: Service,
                 check: tuple[list[str], list[str]] | None = None) -> type[HttpToolsProtocol]:
    """The protocol class for `uvicorn.Config(http=...)`; `check` is `missing()`'s answer."""
    edge, hot = check if check is not None else missing()
    attrs = {"limits": service.limits, "body_limit": service.settings.max_body_bytes}
    if not edge and not hot:
        return type("GrmHttpProtocol", (HotHttpProtocol,), attrs)
    version = uvicorn.__version__
    if not edge:
        log.warning("uvicorn %s lacks what the one-write exchange uses (%s): the hot routes go "
                    "through ASGI (slower; limits kept)", version, ", ".join(hot))
        return type("GrmEdgeProtocol", (EdgeProtocol,), attrs)
    log.warning("uvicorn %s lacks what the edge's protocol uses (%s): serving with uvicorn's "
                "own protocol (no header/body timeouts or byte budget)", version,
                ", ".join(edge + hot))
    return HttpToolsProtocol
