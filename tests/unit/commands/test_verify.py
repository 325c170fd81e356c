"""`grm-service verify`'s output: each condition's result printed once, then one verdict."""

from __future__ import annotations

import httpx
import pytest

from grm_service.commands.verify import check
from grm_service.fingerprint import digest
from grm_service.probes import builtin_probes

URL = "http://service.test"


def service(drift: bool) -> httpx.MockTransport:
    """One replica r0 whose answer is a digest of the request (equal requests, equal answers);
    with `drift`, answers on the pinned replica differ."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/ready":
            return httpx.Response(200, json={"replicas": [{"name": "r0", "state": "ready"}]})
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "rm"}]})
        text = digest(request.content)
        if drift and "x-grm-pin-replica" in request.headers:
            text += "-drifted"
        return httpx.Response(200, json={"choices": [{"message": {"content": text}}]})

    return httpx.MockTransport(answer)


@pytest.mark.parametrize("drift", [False, True])
def test_verify_prints_each_result_once(capsys: pytest.CaptureFixture[str], drift: bool) -> None:
    code = check(URL, builtin_probes(2, None), 30, None, 4, transport=service(drift))
    out = capsys.readouterr().out
    results = out.split("first differing item")[0]  # then the detail of what differs
    for condition in ("repeat", "concurrency 8", "concurrency 4", "shuffled order",
                      "mixed with filler traffic", "replica r0 alone"):
        assert len([line for line in results.splitlines() if condition in line]) == 1, out
    if drift:
        assert code == 1 and "1 of 6 conditions differ" in out
    else:
        assert code == 0 and "all 6 conditions bitwise identical" in out
