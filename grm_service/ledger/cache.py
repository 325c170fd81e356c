"""An identical request answered once: from the record, or by the computation in flight.

A lookup is (fingerprint id, request digest, engine path, scope): the fingerprint id names the
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
import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Protocol

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


# A recorded answer as found again: its payload and its fingerprint fields, marked with how
# it was found (`fields["cache"]`: "hit" or "coalesced").
Found = tuple[dict[str, Any], dict[str, Any]]
_RECENT = 2048


class Recent:
    """The last answers computed here, by lookup (a bounded LRU)."""

    def __init__(self, size: int = _RECENT) -> None:
        self.size = size
        self._items: OrderedDict[Lookup, tuple[dict[str, Any], dict[str, Any]]] = OrderedDict()

    def get(self, lookup: Lookup) -> tuple[dict[str, Any], dict[str, Any]] | None:
        found = self._items.get(lookup)
        if found is not None:
            self._items.move_to_end(lookup)
        return found

    def put(self, lookup: Lookup, answer: Answer) -> None:
        self._items[lookup] = (answer.payload, answer.fields)
        self._items.move_to_end(lookup)
        if len(self._items) > self.size:
            self._items.popitem(last=False)


class Lead:
    """This request computes the answer identical requests in flight wait for (`InFlight`)."""

    def __init__(self, lookup: Lookup, future: asyncio.Future[Any], recent: Recent) -> None:
        self.lookup = lookup
        self.future = future
        self.recent = recent

    def done(self, answer: Answer) -> None:
        """The answer computed: the waiters get it, and later repeats find it where it carries
        the fingerprint id it was looked up by."""
        if answer.fields["fingerprint_id"] == self.lookup[0]:
            self.recent.put(self.lookup, answer)
        self.future.set_result(answer)


class InFlight:
    """Identical requests in flight at once: the first computes (`lead`), the others wait for
    it (`joined`)."""

    def __init__(self) -> None:
        self._running: dict[Lookup, asyncio.Future[Any]] = {}

    async def joined(self, lookup: Lookup) -> Answer | None:
        """The answer of an identical request in flight, once it has it (its error, where it
        failed); None where none is in flight, or its client went away: this one computes."""
        running = self._running.get(lookup)
        if running is None:
            return None
        await asyncio.wait({running})  # raises only if this request itself is cancelled
        if running.cancelled():
            return None
        answer: Answer = running.result()
        return answer

    @contextlib.contextmanager
    def lead(self, lookup: Lookup, recent: Recent) -> Iterator[Lead]:
        """While this request computes `lookup`'s answer, the identical ones wait for it; what
        it raises, they raise; where it is cancelled, they compute it themselves."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._running[lookup] = future
        try:
            yield Lead(lookup, future, recent)
        except Exception as err:
            if not future.done():
                future.set_exception(err)
                future.exception()  # retrieved: nobody may be waiting
            raise
        except BaseException:
            future.cancel()
            raise
        finally:
            if self._running.get(lookup) is future:
                del self._running[lookup]
