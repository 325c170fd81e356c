"""The gateway app in process: built by `create_app`, its lifespan run, driven through ASGI."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
from fastapi import FastAPI

from grm_service.config import Settings
from grm_service.gateway.app import create_app
from grm_service.gateway.edge.hotpath import HotPath
from grm_service.gateway.request.context import ForwardContext
from grm_service.gateway.service import Service


@contextlib.asynccontextmanager
async def serving(settings: Settings, ready: bool = True,
                  timeout_s: float = 10) -> AsyncIterator[tuple[HotPath, ForwardContext]]:
    """The app and its gateway while the lifespan runs; with `ready`, once every replica is."""
    hot = create_app(Service(settings))
    app = cast(FastAPI, hot.app)
    async with app.router.lifespan_context(app):
        gw = hot.service.gateway
        assert gw is not None
        async with asyncio.timeout(timeout_s):
            while ready and len(gw.pool.ready()) < len(gw.pool.replicas):
                await asyncio.sleep(0.01)
        yield hot, gw


def client(app: Any, **headers: str) -> httpx.AsyncClient:
    """An httpx client calling `app` in process (the hot path, or the FastAPI app behind it)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw",
                             headers=headers)


async def received(url: str) -> list[dict[str, Any]]:
    """What a recording stub (`--record N`) was sent since the last call; cleared after."""
    async with httpx.AsyncClient(base_url=url) as stub:
        seen = (await stub.get("/stub/received")).json()
        await stub.delete("/stub/received")
    return list(seen)
