"""An identical request answered once: from the record, or by the computation in flight.

The key is (fingerprint id, request digest, engine path, scope): the fingerprint id names the
seed, the model's files and the numerics environment, so a new model, engine or env never matches
a record of the old one. The scope is the asker's key id (`records.key_id`, a digest of the API
key): a hit tells its asker that someone sent that exact request, so one key is answered from
its own records and computations only; "" where the cache is shared (GRM_LEDGER_CACHE_SHARED).
Recent answers are kept in memory (`Recent`); older ones are looked up in the store, on the
reader's thread. An answer is whatever the request path makes of an engine's
payload and its fingerprint fields (`Answer`): the ledger keeps those two, nothing else.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

Lookup = tuple[str, str, str, str]  # fingerprint id, request digest, engine path, scope


class Answer(Protocol):
    @property
    def payload(self) -> dict[str, Any]: ...

    @property
    def fields(self) -> dict[str, Any]: ...

    @property
    def engine_json(self) -> bytes:
        """The payload as the engine's bytes, where they are strict JSON of it; else b""."""

    @property
    def stamp_json(self) -> str:
        """The fingerprint's fixed part as JSON (`answer.Stamp.json`), which fixes every field
        but `serialized` and the digests; "" where the fields were not built from one."""


A = TypeVar("A", bound=Answer)
Compute = Callable[[], Awaitable[A]]
# How the request path serves a recorded payload and its (marked) fingerprint fields.
Serve = Callable[[dict[str, Any], dict[str, Any]], A]
_RECENT = 2048


def marked(serve: Serve[A], payload: dict[str, Any], fields: dict[str, Any], how: str) -> A:
    """A recorded answer as served again: the recorded payload and fingerprint, marked."""
    return serve(payload, {**fields, "cache": how})


class Recent:
    """The last answers computed here, by key (a bounded LRU)."""

    def __init__(self, size: int = _RECENT) -> None:
        self.size = size
        self._items: OrderedDict[Lookup, tuple[dict[str, Any], dict[str, Any]]] = OrderedDict()

    def get(self, key: Lookup) -> tuple[dict[str, Any], dict[str, Any]] | None:
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
        return found

    def put(self, key: Lookup, answer: Answer) -> None:
        self._items[key] = (answer.payload, answer.fields)
        self._items.move_to_end(key)
        if len(self._items) > self.size:
            self._items.popitem(last=False)


class InFlight:
    """Identical requests in flight at once: the first computes, the others wait for it."""

    def __init__(self) -> None:
        self._running: dict[Lookup, asyncio.Future[Any]] = {}

    async def once(self, key: Lookup, compute: Compute[A]) -> tuple[A, bool]:
        """The answer, and whether it was another request's computation (coalesced)."""
        running = self._running.get(key)
        if running is not None:
            await asyncio.wait({running})  # raises only if this request itself is cancelled
            if not running.cancelled():
                answer: A = running.result()
                return answer, True
            # The first one's client went away: compute it here.
        return await self._lead(key, compute), False

    async def _lead(self, key: Lookup, compute: Compute[A]) -> A:
        future: asyncio.Future[A] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        try:
            answer = await compute()
        except Exception as err:
            future.set_exception(err)
            future.exception()  # retrieved: nobody may be waiting
            raise
        except BaseException:
            future.cancel()
            raise
        finally:
            if self._running.get(key) is future:
                del self._running[key]
        future.set_result(answer)
        return answer
