"""A socket read handed on to a connection's protocol as an asyncio transport hands it on: for
transports that stand in for a socket in tests and in-process benchmarks."""

from __future__ import annotations

import asyncio
from typing import Protocol


class Reading(Protocol):
    """A stand-in transport: the protocol its reads go to (it may be switched meanwhile)."""

    protocol: asyncio.BaseProtocol | None


def hand_on(transport: Reading, data: bytes) -> None:
    """One read: into a buffered protocol's own buffer (at most what it asks for; what is left
    goes to the protocol it then gave the connection to), else to `data_received`."""
    view = memoryview(data)
    while view:
        protocol = transport.protocol
        if not isinstance(protocol, asyncio.BufferedProtocol):
            assert isinstance(protocol, asyncio.Protocol), protocol
            protocol.data_received(data if len(view) == len(data) else bytes(view))
            return
        buffer = memoryview(protocol.get_buffer(len(view)))
        taken = min(len(buffer), len(view))
        buffer[:taken] = view[:taken]
        protocol.buffer_updated(taken)
        view = view[taken:]
