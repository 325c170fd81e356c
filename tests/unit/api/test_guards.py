"""The guards at the edge: keys presented in headers or URLs, the body cap, the refusals' shape."""

from __future__ import annotations

import base64

import pytest

from grm_service.api.guards import presented_key


def basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


@pytest.mark.parametrize(("header", "key"), [
    (b"Bearer k1", b"k1"),
    (b"bearer  k1 ", b"k1"),
    (basic("grm", "k1"), b"k1"),  # http://grm:k1@host/ as aiohttp and httpx send it
    (basic("", "k:with:colons"), b"k:with:colons"),
    (b"Basic not-base64!", None),
    (b"Token k1", None),
    (b"", None),
])
def test_presented_key(header: bytes, key: bytes | None) -> None:
    assert presented_key(header) == key
