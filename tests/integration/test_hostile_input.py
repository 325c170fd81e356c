"""Hostile input, tried through HTTP on a gateway in attach mode with keys set, in front of STUB
replicas that record every body they receive: what is refused must never reach them.

Each test names the checkpoint rule it tries (grm_service/gateway/request/checkpoint.py, images.py,
judge.py).
"""

from __future__ import annotations

import base64
import io
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from tests.support.procs import Proc, gateway_on_stubs, received, running_gateway, start_stub

KEY = "hostile-test-key"
AUTH = {"authorization": f"Bearer {KEY}"}
ALLOWED = "https://allowed.example.com"
MAX_PIXELS = 1_000_000
MAX_ITEMS = 100_000
ENV = {"GRM_API_KEYS": KEY, "GRM_IMAGE_URL_ALLOWLIST": ALLOWED + ",https://img.internal/scans",
       "GRM_MAX_IMAGE_PIXELS": str(MAX_PIXELS), "GRM_MAX_SCORE_ITEMS": str(MAX_ITEMS),
       "GRM_MAX_N": "4", "GRM_MAX_TOKENS_LIMIT": "8192", "GRM_AUDIT_FRACTION": "0",
       # Both worst-case batches owed at once: at the default bound, the second to arrive was
       # refused (429) unless the first had finished, a race the loaded suite can lose.
       "GRM_SCORE_ITEMS_PER_SLOT": str(2 * MAX_ITEMS)}


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, stub_pair: list[Proc]
) -> Iterator[tuple[Proc, list[Proc]]]:
    tmp = tmp_path_factory.mktemp("hostile")
    with gateway_on_stubs(tmp, env=ENV, shared=stub_pair) as pair:
        yield pair


@pytest.fixture
def gateway(service: tuple[Proc, list[Proc]]) -> Proc:
    return service[0]


@pytest.fixture
def stubs(service: tuple[Proc, list[Proc]]) -> list[Proc]:
    received(service[1], clear=True)
    return service[1]


def post(gw: Proc, path: str, body: Any, **kw: Any) -> httpx.Response:
    headers = {**AUTH, **kw.pop("headers", {})}
    return httpx.post(gw.url + path, json=body, headers=headers, timeout=kw.pop("timeout", 60),
                      **kw)


def png(width: int = 8, height: int = 8) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (width, height), 200).save(buf, "PNG")
    return buf.getvalue()


def data_url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def chat_with(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "?"}]}]}


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def refused(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    for word in words:
        assert word in message, message


# -- 1. one checkpoint: content parts, URLs, images, sampling -------------------------------


@pytest.mark.parametrize(
    ("part", "words"),
    [
        (image_part(ALLOWED + ".evil.com/a.png"), ["refused", "GRM_IMAGE_URL_ALLOWLIST"]),
        (image_part("https://allowed.example.com@169.254.169.254/latest"), ["user info"]),
        (image_part("http://allowed.example.com/a.png"), ["refused"]),  # scheme differs
        (image_part("https://allowed.example.com:8443/a.png"), ["refused"]),  # port differs
        (image_part("https://img.internal/scansX/a.png"), ["refused"]),  # not below the path
        (image_part("https://img.internal/scans/../secret"), [".."]),
        (image_part("https://img.internal/scans/%2e%2e/secret"), [".."]),
        (image_part("https://allowed.example.com\\@169.254.169.254/"), ["backslash"]),
        (image_part("file:///etc/passwd"), ["scheme"]),
        ({"type": "audio_url", "audio_url": {"url": "http://169.254.169.254/"}}, ["audio_url"]),
        ({"type": "video_url", "video_url": {"url": "http://169.254.169.254/"}}, ["video_url"]),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
         ["input_audio"]),
        ({"image_url": {"url": "http://169.254.169.254/"}}, ["type None"]),  # type inferred
        ({**image_part(data_url(png())), "uuid": "cached-x"}, ["uuid"]),
        ({"type": "text", "text": "x", "image_url": {"url": "http://10.0.0.1/"}}, ["image_url"]),
    ],
)
def test_content_parts_and_urls_outside_the_allow_list_never_reach_an_engine(
    gateway: Proc, stubs: list[Proc], part: dict[str, Any], words: list[str]
) -> None:
    refused(post(gateway, "/v1/chat/completions", chat_with(part)), 400, *words)
    assert received(stubs) == []


def test_exact_allow_list_entries_are_forwarded(gateway: Proc, stubs: list[Proc]) -> None:
    for url in (ALLOWED + "/a.png", "https://ALLOWED.example.com:443/b.png",
                "https://img.internal/scans/2026/page.png"):
        r = post(gateway, "/v1/chat/completions", chat_with(image_part(url)))
        assert r.status_code == 200, r.text
    sent = [b["body"]["messages"][0]["content"][0]["image_url"]["url"] for b in received(stubs)]
    assert len(sent) == 3


def test_classify_bodies_pass_the_checkpoint(gateway: Proc, stubs: list[Proc]) -> None:
    remote = {"messages": chat_with(image_part("http://169.254.169.254/x"))["messages"]}
    refused(post(gateway, "/classify", remote), 400, "refused")
    refused(post(gateway, "/classify", {"input": "x", "seed": "7"}), 400, "seed")
    assert received(stubs) == []
    ok = post(gateway, "/classify", {"input": "a text", "seed": 5})
    assert ok.status_code == 200, ok.text
    assert ok.json()["grm_fingerprint"]["seed"] == 5
    assert [b["body"] for b in received(stubs)] == [{"input": "a text", "seed": 5,
                                                     "model": "rm"}]


@pytest.mark.parametrize("field", ["messages", "model", "prompt", "stream", "n", "tools"])
def test_score_sampling_cannot_set_request_fields(
    gateway: Proc, stubs: list[Proc], field: str
) -> None:
    hijack = {"messages": [{"role": "user", "content": [image_part("http://169.254.169.254/")]}],
              "model": "other", "prompt": "x", "stream": True, "n": 2, "tools": []}
    body = {"scorer": "judge", "items": [{"id": "a", "completion": "x"}],
            "sampling": {field: hijack[field]}}
    refused(post(gateway, "/v1/score", body), 400, f"sampling may not set {field}")
    assert received(stubs) == []


def test_score_item_conversations_pass_the_checkpoint(gateway: Proc, stubs: list[Proc]) -> None:
    messages = chat_with(image_part("http://169.254.169.254/"))["messages"]
    body = {"scorer": "classify", "items": [{"id": "a", "extra": {"messages": messages}},
                                            {"id": "b", "completion": "fine"}]}
    r = post(gateway, "/v1/score", body)
    assert r.status_code == 200, r.text
    bad, good = r.json()["results"]
    assert bad["status"] == "error" and "refused" in bad["error"]
    assert good["status"] == "ok"
    assert len(received(stubs)) == 1


def test_one_set_of_image_limits_for_chat_and_score(gateway: Proc, stubs: list[Proc]) -> None:
    over, under = png(1100, 1000), png(900, 900)  # 1.1 MP and 0.81 MP against a 1 MP limit
    cut = png(300, 300)[:-40]
    for raw, words in ((over, "limit is 1000000 pixels"), (cut, "cannot be decoded")):
        refused(post(gateway, "/v1/chat/completions", chat_with(image_part(data_url(raw)))),
                400, *words)
        score = {"scorer": "ocr", "items": [{"id": "a", "image": base64.b64encode(raw).decode(),
                                             "reference": "x"}]}
        item = post(gateway, "/v1/score", score).json()["results"][0]
        assert item["status"] == "error" and words[0] in item["error"], item
    assert received(stubs) == []
    assert post(gateway, "/v1/chat/completions",
                chat_with(image_part(data_url(under)))).status_code == 200
    score = {"scorer": "ocr", "items": [{"id": "a", "image": data_url(under), "reference": "x"}]}
    assert post(gateway, "/v1/score", score).json()["results"][0]["status"] == "ok"
    assert len(received(stubs)) == 2


# -- 2. bounded client options ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"template": "{prompt:>100000000}"}, ["format specs"]),
        ({"template": "{prompt.__class__.__init__}"}, ["attribute access"]),
        ({"template": "{completion}" * 3}, ["3 times"]),
        ({"pattern": "(a)\\1"}, ["RE2"]),
        ({"min": "low"}, ["finite number"]),
        ({"label": 1}, ["unknown label"]),
    ],
)
def test_judge_options_are_bounded(
    gateway: Proc, stubs: list[Proc], options: dict[str, Any], words: list[str]
) -> None:
    body = {"scorer": "judge", "items": [{"id": "a", "completion": "x"}], "options": options}
    refused(post(gateway, "/v1/score", body), 400, *words)
    assert received(stubs) == []


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 5},
         400, ["n=5", "cap of 4", "GRM_MAX_N"]),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                  "max_tokens": 9000}, 400, ["cap of 8192"]),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                  "max_completion_tokens": 9000}, 400, ["GRM_MAX_TOKENS_LIMIT"]),
        ("/v1/score", {"scorer": "judge", "items": [{"id": "a", "completion": "x"}],
                       "sampling": {"max_tokens": 9000}}, 400, ["cap of 8192"]),
        ("/v1/score", {"scorer": "judge", "items": [{"id": str(i)} for i in range(MAX_ITEMS + 1)]},
         413, [f"limit is {MAX_ITEMS}", "GRM_MAX_SCORE_ITEMS"]),
        ("/openrlhf/reward", {"query": ["q"] * (MAX_ITEMS + 1)}, 413, ["GRM_MAX_SCORE_ITEMS"]),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                  "chat_template": "{{ 7 * 7 }}"}, 400, ["chat_template"]),
    ],
)
def test_caps_refuse_naming_the_cap(
    gateway: Proc, stubs: list[Proc], path: str, body: dict[str, Any], status: int,
    words: list[str],
) -> None:
    refused(post(gateway, path, body), status, *words)
    assert received(stubs) == []


def test_health_answers_while_worst_case_options_are_in_flight(
        gateway: Proc, tmp_path: Path) -> None:
    # (\w|\w|\w)+! takes 3**n steps in Python's re on the STUB's 21-character answers.
    judge = {"scorer": "judge", "options": {"pattern": r"(?:\w|\w|\w)+!(\d)"},
             "items": [{"id": str(i), "completion": "x"} for i in range(200)]}
    batch = {"scorer": "ocr", "items": [{"id": str(i)} for i in range(MAX_ITEMS)]}
    answers: dict[str, httpx.Response] = {}

    def send(name: str, body: dict[str, Any]) -> None:
        answers[name] = post(gateway, "/v1/score", body, timeout=300)

    # The bound is the behaviour: scoring never holds the event loop (decoding or encoding a
    # batch of 100,000 items on it takes seconds, a backtracking pattern hours). It is scaled by
    # this machine's pace at the time: the slowest /health with nothing in flight, and the
    # slowest of an idle server process sampled alongside (on a shared machine other jobs can
    # starve every process for a while; a held event loop holds up the gateway alone).
    idle = max(health_s(gateway) for _ in range(20))
    control = start_stub(tmp_path)
    try:
        workers = [threading.Thread(target=send, args=item)
                   for item in (("judge", judge), ("batch", batch))]
        for worker in workers:
            worker.start()
        slowest = paced = 0.0
        while any(w.is_alive() for w in workers):
            slowest = max(slowest, health_s(gateway))
            paced = max(paced, health_s(control))
            time.sleep(0.05)
        for worker in workers:
            worker.join()
    finally:
        control.stop(signal.SIGKILL)
    bound = 1.0 + 10 * max(idle, paced)
    assert answers["judge"].status_code == answers["batch"].status_code == 200
    assert len(answers["batch"].json()["results"]) == MAX_ITEMS
    assert all("no score" in r["error"] for r in answers["judge"].json()["results"])
    assert slowest < bound, (f"/health took {slowest:.2f} s ({idle:.3f} s with nothing in flight,"
                             f" an idle server's at most {paced:.3f} s meanwhile)")


def health_s(gateway: Proc) -> float:
    start = time.monotonic()
    assert httpx.get(gateway.url + "/health", timeout=10).status_code == 200
    return time.monotonic() - start


# -- 3. truthful seeds -----------------------------------------------------------------------


@pytest.mark.parametrize("seed", ["abc", [1], 1.9, True, -1, 2**63, 1.0])
def test_seeds_that_are_not_engine_integers_are_refused(
    gateway: Proc, stubs: list[Proc], seed: Any
) -> None:
    chat = {"messages": [{"role": "user", "content": "x"}], "seed": seed}
    refused(post(gateway, "/v1/chat/completions", chat), 400, "seed")
    score = {"scorer": "judge", "items": [{"id": "a", "completion": "x"}],
             "sampling": {"seed": seed}}
    refused(post(gateway, "/v1/score", score), 400, "seed")
    refused(post(gateway, "/classify", {"input": "x", "seed": seed}), 400, "seed")
    assert received(stubs) == []


def test_fingerprint_seed_is_the_seed_the_engine_got(gateway: Proc, stubs: list[Proc]) -> None:
    top = 2**63 - 1
    chat = post(gateway, "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "x"}], "seed": top})
    score = post(gateway, "/v1/score", {"scorer": "judge", "sampling": {"seed": 3},
                                        "items": [{"id": "a", "completion": "x"}]})
    fps = [chat.json()["grm_fingerprint"], score.json()["results"][0]["fingerprint"]]
    got = [b["body"]["seed"] for b in received(stubs)]
    assert sorted(fp["seed"] for fp in fps) == sorted(got) == [3, top]


# -- 4. no 500 from input --------------------------------------------------------------------


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "x": %s}'),
        ("/v1/score", '{"scorer": "judge", "items": [{"id": "a", "extra": {"x": %s}}]}'),
        ("/classify", '{"input": "x", "x": %s}'),
        ("/openrlhf/reward", '{"query": ["q"], "labels": [%s]}'),
    ],
)
def test_deep_nesting_is_a_4xx(gateway: Proc, stubs: list[Proc], path: str, raw: str) -> None:
    for levels in (900, 100_000):
        r = httpx.post(gateway.url + path, content=raw % deep(levels), timeout=60,
                       headers={**AUTH, "content-type": "application/json"})
        refused(r, 400, "GRM_MAX_JSON_DEPTH")
    assert received(stubs) == []


# Each route's body with a string to fill; the chat body also with a long string in front (the
# hot path parses a body of LONG bytes or more another way).
ROUTE_BODIES = [
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "%s"}]}'),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "' + "a" * 9000 + '"}, '
     '{"role": "user", "content": "%s"}]}'),
    ("/classify", '{"input": "%s"}'),
    ("/v1/score", '{"scorer": "judge", "items": [{"id": "a", "completion": "%s"}]}'),
    ("/openrlhf/reward", '{"query": ["%s"], "prompts": ["p"]}'),
]


@pytest.mark.parametrize(("path", "raw"), ROUTE_BODIES,
                         ids=["chat", "chat-long", "classify", "score", "openrlhf"])
@pytest.mark.parametrize(("text", "words"), [
    (b"\\ud800", ["the JSON escape \\ud800", "surrogate pair"]),
    (b"ok \\udfff", ["the JSON escape \\udfff"]),
    (b"\xed\xa0\x80", ["ED A0", "not valid UTF-8"]),
], ids=["escaped-high", "escaped-low", "utf8-encoded"])
def test_lone_surrogates_are_400_on_every_route(
    gateway: Proc, stubs: list[Proc], path: str, raw: str, text: bytes, words: list[str]
) -> None:
    body = raw.encode().replace(b"%s", text)
    r = httpx.post(gateway.url + path, content=body, timeout=60,
                   headers={**AUTH, "content-type": "application/json"})
    refused(r, 400, *words)
    assert received(stubs) == []
    whole = raw.encode().replace(b"%s", "\\ud83d\\ude00 \U0001f600 \ud55c".encode())
    r = httpx.post(gateway.url + path, content=whole, timeout=60,
                   headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("scorer", "options"),
    [("classify", {"label": "last"}), ("classify", {"label": 1.5}),
     ("classify", {"output": ["prob"]}), ("judge", {"max": [10]}), ("ocr", {"x": 1})],
)
def test_wrong_option_types_are_400(
    gateway: Proc, stubs: list[Proc], scorer: str, options: dict[str, Any]
) -> None:
    body = {"scorer": scorer, "items": [{"id": "a", "completion": "x"}], "options": options}
    refused(post(gateway, "/v1/score", body), 400)
    assert received(stubs) == []


# -- 5. secrets and internals ----------------------------------------------------------------


def test_ready_details_need_the_key(gateway: Proc) -> None:
    open_ready = httpx.get(gateway.url + "/ready")
    assert open_ready.status_code == 200 and open_ready.json() == {"ready": True}
    with_key = httpx.get(gateway.url + "/ready", headers=AUTH).json()
    assert {r["name"] for r in with_key["replicas"]} == {"r0", "r1"}


def test_unknown_pin_is_400_and_known_pin_serves(gateway: Proc, stubs: list[Proc]) -> None:
    body = {"messages": [{"role": "user", "content": "x"}]}
    refused(post(gateway, "/v1/chat/completions", body, headers={"x-grm-pin-replica": "r9"}),
            400, "r0, r1")
    assert "retry-after" not in post(gateway, "/v1/chat/completions", body,
                                     headers={"x-grm-pin-replica": "r9"}).headers
    pinned = post(gateway, "/v1/chat/completions", body, headers={"x-grm-pin-replica": "r1"})
    assert pinned.headers["x-grm-replica"] == "r1"


def test_502_names_the_replica_not_its_address(tmp_path: Path) -> None:
    stub = start_stub(tmp_path)
    port = stub.url.rsplit(":", 1)[1]
    # No health check between the kill and the request: one would mark the replica down first,
    # and the answer would be a 503 (no healthy replica), not the failed attempt's 502.
    env = {"GRM_CANARY": "false", "GRM_HEALTH_INTERVAL_S": "600"}
    with running_gateway(tmp_path, "--replica-url", stub.url, "--served-model-name", "rm",
                         timeout=60, env=env) as gw:
        stub.stop(signal.SIGKILL)
        r = httpx.post(gw.url + "/v1/chat/completions", timeout=30,
                       json={"messages": [{"role": "user", "content": "x"}]})
        logged = gw.tail(200)
    refused(r, 502, "r0: connection failed")
    for internal in ("127.0.0.1", port, "Connector", "Error(", "<"):
        assert internal not in r.text, r.text
    assert stub.url in logged, "the log keeps the detail"


def test_an_answer_over_the_response_cap_is_a_502_naming_it(tmp_path: Path) -> None:
    stub = start_stub(tmp_path, "--pad", "20000")  # chat answers only
    try:
        env = {"GRM_CANARY": "false", "GRM_MAX_RESPONSE_BYTES": "16384"}
        with running_gateway(tmp_path, "--replica-url", stub.url, "--served-model-name", "rm",
                             timeout=60, env=env) as gw:
            r = httpx.post(gw.url + "/v1/chat/completions", timeout=30,
                           json={"messages": [{"role": "user", "content": "x"}]})
            refused(r, 502, "r0: the answer is over 16384 bytes", "GRM_MAX_RESPONSE_BYTES")
            assert r.json()["error"]["code"] == "response_too_large"
            assert r.json()["error"]["type"] == "server_error"
            # The half-read connection was dropped; the replica is still served.
            r = httpx.post(gw.url + "/classify", json={"input": "x"}, timeout=30)
            assert r.status_code == 200, r.text
    finally:
        stub.stop()


# -- memory ----------------------------------------------------------------------------------

# Peak RSS growth of the gateway for the largest bodies it accepts (32 MiB, the default body
# limit): a 32 MiB string, and a body at the JSON-value limit. Measured 192 MiB (2 cores,
# Python 3.11); the bound leaves room for allocator noise.
RSS_BOUND_MIB = 300


def peak_rss_mib(proc: Proc) -> float:
    for line in Path(f"/proc/{proc.popen.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_gateway_memory_is_bounded_for_the_largest_accepted_request(tmp_path: Path) -> None:
    with gateway_on_stubs(tmp_path, count=1, env={"GRM_AUDIT_FRACTION": "0"}) as (gw, _):
        base = peak_rss_mib(gw)
        text = "x" * (32 * 1024 * 1024 - 200)
        r = httpx.post(gw.url + "/v1/chat/completions", timeout=120,
                       json={"messages": [{"role": "user", "content": text}]})
        assert r.status_code == 200, r.text[:300]
        values = json.dumps({"scorer": "ocr", "items": [{"id": "a", "extra": {
            "v": [0] * 999_000}}]})
        r = httpx.post(gw.url + "/v1/score", content=values, timeout=120,
                       headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text[:300]
        over = values.replace("[0", "[0" + ",0" * 2000)
        r = httpx.post(gw.url + "/v1/score", content=over, timeout=120,
                       headers={"content-type": "application/json"})
        refused(r, 413, "GRM_MAX_JSON_VALUES")
        grown = peak_rss_mib(gw) - base
    assert grown < RSS_BOUND_MIB, f"peak RSS grew {grown:.0f} MiB"
