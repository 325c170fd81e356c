"""`replies.wire`: a `Reply` as HTTP/1.1 bytes, its header lines checked for a split."""

from __future__ import annotations

import pytest

from grm_service.gateway.edge.replies import header_lines, wire

DEFAULTS = b"date: Sat, 05 Dec 2026 10:00:00 GMT\r\nserver: uvicorn\r\n"


def test_a_reply_is_written_line_by_line() -> None:
    answer = (200, [(b"x-grm-seed", b"7"), (b"content-length", b"2")], b"{}")
    assert wire(answer, DEFAULTS, keep_alive=True) == (
        b"HTTP/1.1 200 OK\r\n" + DEFAULTS
        + b"x-grm-seed: 7\r\ncontent-length: 2\r\n\r\n{}")
    assert wire(answer, DEFAULTS, keep_alive=False).endswith(
        b"content-length: 2\r\nconnection: close\r\n\r\n{}")


def test_no_headers_no_lines() -> None:
    assert header_lines([]) == b""
    assert wire((204, [], b""), b"", keep_alive=True) == b"HTTP/1.1 204 No Content\r\n\r\n"


@pytest.mark.parametrize("value", [b"a\r\nset-cookie: x", b"a\nb", b"a\rb"])
def test_a_header_that_would_split_the_response_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError, match="invalid HTTP header value"):
        wire((200, [(b"x-grm-replica", value)], b""), DEFAULTS, keep_alive=True)
