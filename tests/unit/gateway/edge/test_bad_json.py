"""A body that is not JSON, refused with its place (line, column, byte), what was expected there
and the text around it; a body cut short says it ended early. Every door says the same bytes:
the FastAPI routes, the hot path as ASGI and the one-write exchange, on every route that reads
a JSON body (a STUB replica behind: nothing refused reaches it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grm_service.config import Settings
from grm_service.gateway.edge.bad_json import invalid_json
from tests.support.gateway import client, received, serving
from tests.support.procs import Proc
from tests.unit.gateway.edge.test_protocol import Connection, post

MIDDLE = b'{"messages": [{"role": "user", "content": "x"}]\n "seed": 1}'
CUT = b'{\n  "messages": [\n    {"role": "user", "content": "x"}'
NOT_UTF8 = b'{"messages": [{"role": "user", "content": "\xff"}]}'


@pytest.mark.parametrize(("raw", "message"), [
    (MIDDLE, "invalid JSON at line 2, column 2 (byte 49): expected ',' or '}', found "
             "'\"seed\": 1}' after '...ser\", \"content\": \"x\"}]\\n '"),
    (CUT, "the body ended early at line 3, column 37 (byte 54): expected ',' or ']' after "
          "'... \"user\", \"content\": \"x\"}'"),
    (b'{"a": [1, 2 3]}', "invalid JSON at line 1, column 13 (byte 12): expected ',' or ']', "
                         "found '3]}' after '{\"a\": [1, 2 '"),
    (b'{"a": 1,\n "b": 2', "the body ended early at line 2, column 8 (byte 16): expected ',' or "
                           "'}' after '{\"a\": 1,\\n \"b\": 2'"),
    (b'{"a": "\xc3\xa9t\xc3\xa9', "the body ended early at line 1, column 11 (byte 12), inside "
                                  "the string that starts at line 1, column 7: expected a "
                                  "closing '\"' after '{\"a\": \"été'"),
    (b'{"a" 1}', "invalid JSON at line 1, column 6 (byte 5): expected ':', found '1}' after "
                 "'{\"a\" '"),
    (b"{", "the body ended early at line 1, column 2 (byte 1): expected a property name in "
           "double quotes or '}' after '{'"),
    (b'{"a": 1,}', "invalid JSON at line 1, column 9 (byte 8): expected a property name in "
                   "double quotes, found '}' after '{\"a\": 1,'"),
    (b"[1,", "the body ended early at line 1, column 4 (byte 3): expected a JSON value (object, "
             "array, string, number, true, false or null) after '[1,'"),
    (b'{"a": 1} {}', "invalid JSON at line 1, column 10 (byte 9): expected the end of the body "
                     "(one JSON value only), found '{}' after '{\"a\": 1} '"),
    (b'{"a": "x\ny"}', "invalid JSON at line 1, column 9 (byte 8): expected an escaped control "
                       "character (\\n, \\t or \\u00XX), found '\\ny\"}' after '{\"a\": \"x'"),
    (b'{"a": "\xff"}', "the body is not UTF-8: byte 0xff at line 1, column 8 (byte 7) starts no "
                       "UTF-8 character; send JSON as UTF-8 (after '{\"a\": \"')"),
    (b"\xef\xbb\xbf{,}", "invalid JSON at line 1, column 2 (byte 4): expected a property name in "
                         "double quotes or '}', found ',}' after '{'"),
    (b" \n", "the body is empty: send one JSON object"),
], ids=range(14))
def test_the_place_what_was_expected_and_the_text_around_it(raw: bytes, message: str) -> None:
    err = invalid_json(raw)
    assert (err.message, err.http_status, err.code) == (message, 400, "invalid_json")


def test_the_excerpt_is_short_where_the_body_is_long() -> None:
    raw = b'{"image": "' + b"A" * 100_000 + b'" "n": 1}'
    message = invalid_json(raw).message
    assert message.startswith("invalid JSON at line 1, column 100014 (byte 100013)")
    assert message.endswith("""found '"n": 1}' after '...AAAAAAAAAAAAAAAAAAAAAA" '""")


ROUTES = ["/v1/chat/completions", "/classify", "/v1/score", "/openrlhf/reward"]


async def test_every_door_refuses_bad_json_with_the_same_bytes(stub: Proc,
                                                               tmp_path: Path) -> None:
    settings = Settings(replica_urls=[stub.url], served_model_name="rm", work_dir=tmp_path)
    headers = {"content-type": "application/json"}
    async with serving(settings) as (hot, _), client(hot.app) as routes, client(hot) as asgi:
        await received(stub.url)  # the canary's probes
        for path in ROUTES:
            for raw in (MIDDLE, CUT, NOT_UTF8):
                by_route = await routes.post(path, content=raw, headers=headers)
                by_asgi = await asgi.post(path, content=raw, headers=headers)
                connection = Connection(hot, hot.app)  # type: ignore[arg-type]
                try:
                    written = await connection.send(post(path, raw))
                finally:
                    connection.close()
                head, _, by_wire = written.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 400 "), (path, head)
                assert by_route.status_code == by_asgi.status_code == 400
                assert by_route.content == by_asgi.content == by_wire, path
                error = json.loads(by_wire)["error"]
                assert error == {"message": invalid_json(raw).message, "param": None,
                                 "type": "invalid_request_error", "code": "invalid_json"}
        assert await received(stub.url) == [], "nothing refused reaches the replica"
