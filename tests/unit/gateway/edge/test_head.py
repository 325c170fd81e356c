"""`RequestHead`: the headers the edge reads, from uvicorn's parsed list (names lower-case)."""

from __future__ import annotations

import pytest

from grm_service.gateway.edge.head import RequestHead

BASE = [(b"host", b"gw"), (b"content-type", b"application/json"), (b"content-length", b"12")]


def test_the_fields_the_edge_reads() -> None:
    head = RequestHead([*BASE, (b"authorization", b"Bearer k"), (b"x-grm-pin-replica", b"r1"),
                        (b"x-grm-run", b"run-1"), (b"x-grm-step", b"7"), (b"accept", b"*/*")])
    assert (head.authorization, head.content_length, head.json) == (b"Bearer k", 12, True)
    assert (head.pin, head.run, head.step) == ("r1", "run-1", "7")
    assert head.repeated == "" and not head.expect_continue


def test_absent_and_unreadable_fields() -> None:
    head = RequestHead([(b"content-length", b"-3"), (b"content-type", b"text/plain")])
    assert (head.authorization, head.content_length, head.json) == (b"", -1, False)
    assert (head.pin, head.run, head.step) == (None, None, None)
    assert RequestHead([]).json  # no content type: read as JSON, as FastAPI does


@pytest.mark.parametrize(("extra", "repeated"), [
    ([(b"authorization", b"a"), (b"authorization", b"b")], "authorization"),
    ([(b"host", b"other")], "host"),
    ([(b"content-length", b"12")], "content-length"),
    ([(b"accept", b"a"), (b"accept", b"b")], ""),  # not a singleton: allowed
    ([(b"x-grm-run", b"a"), (b"x-grm-run", b"b")], ""),
])
def test_a_singleton_header_given_twice_is_named(extra: list[tuple[bytes, bytes]],
                                                  repeated: str) -> None:
    assert RequestHead([*BASE, *extra]).repeated == repeated


def test_a_repeated_tag_keeps_its_last_value() -> None:
    head = RequestHead([*BASE, (b"x-grm-run", b"a"), (b"x-grm-run", b"b")])
    assert head.run == "b"


@pytest.mark.parametrize(("extra", "expects"), [
    ([(b"expect", b"100-Continue")], True),
    ([(b"expect", b"something")], False),
    ([(b"expect", b"100-continue"), (b"expect", b"x")], True),  # any of them, as uvicorn reads
    ([(b"expect", b"x"), (b"expect", b"100-continue")], True),
])
def test_expect_100_continue(extra: list[tuple[bytes, bytes]], expects: bool) -> None:
    assert RequestHead([*BASE, *extra]).expect_continue is expects
