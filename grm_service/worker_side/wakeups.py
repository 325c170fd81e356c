"""Wake-ups between the worker processes of `serve --workers N`: a task that waits for a shared
gate (shared_gate.py) sleeps on an event that another process sets through a socket, instead of
polling the gate.

Each worker binds one Unix datagram socket, named in Linux's abstract namespace after the path
the run's gate files are named from (no path to remove, no length limit; it goes with the
process). Whoever frees something a waiter may want sends one byte to each worker that has
waiters; the receiving loop reads what came and sets its one event, and every parked task
retries. A worker also reads its inbox with no task parked: a waiter for a slot wakes the
workers that may keep spares of it, and a wake-up received runs `on_wake` (the gates' look).
One event per process, not one per replica: a byte that could not be sent (the receiver's
queue is full) is then never a lost wake-up, because the bytes already queued wake the same
tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

_WAKE = b"w"


def address(gates: Path, worker: int) -> str:
    """The abstract socket name of `worker` in the run whose gate files are named from `gates`."""
    run = hashlib.blake2b(str(gates.resolve()).encode(), digest_size=12).hexdigest()
    return f"\0grm-wake-{run}-{worker}"


class Sender:
    """Sends wake-ups to the workers of one run (the manager uses one too)."""

    def __init__(self, gates: Path, workers: int) -> None:
        self._names = [address(gates, w) for w in range(workers)]
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)

    def wake(self, workers: Iterable[int]) -> None:
        for worker in workers:
            # Gone (dead, restarting): nobody waits there. Full: the queued bytes wake it.
            with contextlib.suppress(OSError):
                self._sock.sendto(_WAKE, self._names[worker])

    def close(self) -> None:
        self._sock.close()


class Wakeups(Sender):
    """This worker's end: its socket, and the event its parked tasks wait on."""

    def __init__(self, gates: Path, worker: int, workers: int,
                 on_wake: Callable[[], None] | None = None) -> None:
        super().__init__(gates, workers)
        self._on_wake = on_wake  # also run at each wake-up received
        self._inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._inbox.setblocking(False)
        self._inbox.bind(address(gates, worker))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def event(self) -> asyncio.Event:
        """What the next wake-up sets: taken before the attempt that a change would retry, so a
        change after that attempt cannot go unseen."""
        self.listen()
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    def listen(self) -> None:
        """Read the inbox on the running loop (again, if it is another loop than before)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._inbox)
            loop.add_reader(self._inbox, self._received)
            self._loop, self._event = loop, None

    def _received(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._inbox.recv(64):
                pass
        self.wake_here()
        if self._on_wake is not None:
            self._on_wake()

    def wake_here(self) -> None:
        """Wake this process's parked tasks (a change made here, or one received)."""
        event, self._event = self._event, None
        if event is not None:
            event.set()

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._inbox)
        self._inbox.close()
        super().close()
