"""Concurrent one-sample reward calls on one event loop, sent as one `/v1/score` batch.

verl's reward loop (and verl-omni's visual managers) call the reward function once per sample,
all samples of a worker's share at once, on the worker's event loop. Each call hands its item to
the batcher of its (endpoint, scorer, options, sampling) and awaits its own result; the batcher
sends what has gathered when `max_items` are waiting or `wait_s` after the first arrived. The
scores do not depend on how items were grouped: each item is its own request to the replicas,
and its seed and fingerprint come from that request alone.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from grm_service.client import AsyncGrmClient
from grm_service.integrations.common import Endpoint
from grm_service.wire import ItemResult, ScoreItem

WAIT_S = 0.05  # against seconds per OCR or judge answer: free


@dataclass
class MicroBatcher:
    client: AsyncGrmClient
    scorer: str
    options: Mapping[str, Any]
    sampling: Mapping[str, Any]
    max_items: int = 32
    wait_s: float = WAIT_S
    _pending: list[tuple[ScoreItem, asyncio.Future[ItemResult]]] = field(default_factory=list)
    _timer: asyncio.TimerHandle | None = None
    _sending: set[asyncio.Task[None]] = field(default_factory=set)

    async def score(self, item: ScoreItem) -> ItemResult:
        """This item's result, scored in a batch with the calls that came at the same time."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ItemResult] = loop.create_future()
        self._pending.append((item, future))
        if len(self._pending) >= self.max_items:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.wait_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._sending.add(task)  # a task nobody holds may be collected mid-flight
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[ScoreItem, asyncio.Future[ItemResult]]]) -> None:
        # Ids unique within the batch (every call brings its own "0"). An item of a held group
        # keeps its own: the service tells the group's items, which come in several batches,
        # by their ids.
        items = [item if item.group_id else replace(item, id=str(i))
                 for i, (item, _) in enumerate(batch)]
        try:
            answer = await self.client.score_batch(items, self.scorer, self.sampling,
                                                   self.options)
        except Exception as err:  # every waiting call gets the batch's failure
            for _, future in batch:
                if not future.done():
                    future.set_exception(err)
            return
        for (_, future), result in zip(batch, answer.results, strict=True):
            if not future.done():
                future.set_result(result)


BatchKey = tuple[Endpoint, str, str, str, int, float]

# The reward functions are plain functions called per sample: batchers and clients can only be
# shared through module state, kept per event loop (an async client belongs to its loop).
_CLIENTS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[Endpoint, AsyncGrmClient]
] = weakref.WeakKeyDictionary()
_BATCHERS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[BatchKey, MicroBatcher]
] = weakref.WeakKeyDictionary()


def shared_client(where: Endpoint) -> AsyncGrmClient:
    per_loop = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    if where not in per_loop:
        per_loop[where] = where.async_client()
    return per_loop[where]


def batcher(
    where: Endpoint, scorer: str, options: Mapping[str, Any] | None,
    sampling: Mapping[str, Any] | None, wait_s: float = WAIT_S,
) -> MicroBatcher:
    """This loop's batcher for these settings (one per distinct configuration)."""
    options, sampling = dict(options or {}), dict(sampling or {})
    key: BatchKey = (where, scorer, json.dumps(options, sort_keys=True),
                     json.dumps(sampling, sort_keys=True), where.batch_size, wait_s)
    per_loop = _BATCHERS.setdefault(asyncio.get_running_loop(), {})
    if key not in per_loop:
        per_loop[key] = MicroBatcher(shared_client(where), scorer, options, sampling,
                                     where.batch_size, wait_s)
    return per_loop[key]


def clients_of_this_loop() -> int:
    return len(_CLIENTS.get(asyncio.get_running_loop(), {}))


async def close_clients() -> None:
    """Close the clients this event loop's calls share (verl never needs to: they live as long
    as its reward workers)."""
    loop = asyncio.get_running_loop()
    _BATCHERS.pop(loop, None)
    for client in _CLIENTS.pop(loop, {}).values():
        await client.aclose()
