"""Schema fuzzing: schemathesis generates requests from the gateway's own /openapi.json.

The gateway sits in front of two STUB backends that stay up for the whole run, so any 5xx is the
gateway's own fault (a 502/503 for a deliberately stopped backend would be legitimate; none is
stopped here). `/v1/score`'s schema enumerates the scorers and each one's options, so the
fuzzer reaches the scorers themselves (the recording STUBs show that it did). The schemathesis CLI
runs in a subprocess: its Hypothesis machinery stays out of
this pytest process (and its `filterwarnings = error`), and its report says how many cases ran.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.procs import Proc, gateway_on_stubs, received

MIN_CASES = 1000
# Cases per operation: the 7 GETs take no parameters (a handful of cases each), so the 4 POSTs
# carry the total.
MAX_EXAMPLES = 300
# Fixed, so a CI failure reproduces; change it locally to explore further.
SEED = 20240611

# The STUB answers "stub-<hash>", never a score, so every judged item fails and the OpenRLHF
# endpoint answers with error_reward; pinned to a plain value so the fuzzing budget goes to the
# body (a non-finite value is a 422, tested in test_trainer_auth.py).
CONFIG = """
[[operations]]
include-path = "/openrlhf/reward"
parameters = { "query.error_reward" = 0.0 }
"""


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def gateway_and_stubs(tmp: Path) -> Iterator[tuple[Proc, list[Proc]]]:
    with gateway_on_stubs(tmp, stub_args=("--record", "100000")) as pair:
        yield pair


@pytest.fixture(scope="module")
def stubs(gateway_and_stubs: tuple[Proc, list[Proc]]) -> list[Proc]:
    return gateway_and_stubs[1]


@pytest.fixture(scope="module")
def gateway(gateway_and_stubs: tuple[Proc, list[Proc]]) -> Proc:
    return gateway_and_stubs[0]


def schemathesis_argv(url: str, tmp: Path) -> list[str]:
    config = tmp / "schemathesis.toml"
    config.write_text(CONFIG)
    return [
        str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(config),
        "run", url + "/openapi.json", "--checks", "not_a_server_error",
        "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--workers", "2",
        "--generation-database", "none", "--request-timeout", "60", "--no-color",
        "--report", "json", "--report-dir", str(tmp / "report"),
        "--report-json-path", str(tmp / "report.json"),
    ]


def run_schemathesis(gateway: Proc, tmp: Path) -> tuple[dict[str, Any], str]:
    argv = schemathesis_argv(gateway.url, tmp)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp,
                          check=False)
    out = done.stdout + done.stderr
    report_path = tmp / "report.json"
    assert report_path.exists(), f"schemathesis wrote no report ({done.returncode}):\n{out}"
    return json.loads(report_path.read_text()), f"$ {' '.join(argv)}\n{out}"


def test_no_server_errors_in_generated_requests(
    gateway: Proc, stubs: list[Proc], tmp: Path
) -> None:
    report, out = run_schemathesis(gateway, tmp)
    # The failure's text carries schemathesis's own "Reproduce with: curl ..." for each case.
    tail = out[-20000:]
    assert not report["failures"], f"5xx found:\n{tail}"
    assert not report["errors"], f"schemathesis errors:\n{tail}"
    assert report["exit_code"] == 0, tail
    ops = report["operations"]
    assert ops["tested"] == ops["selected"] >= 11, f"untested operations: {ops}"
    assert report["test_cases"]["generated"] >= MIN_CASES, report["test_cases"]
    down = [s.url for s in stubs if s.popen.poll() is not None]
    assert not down, f"a STUB backend died during the run, 5xx would not count: {down}"
    schema = httpx.get(gateway.url + "/openapi.json").json()["components"]["schemas"]
    assert schema["ScoreRequest"]["properties"]["scorer"]["enum"] == ["classify", "judge", "ocr"]
    bodies = received(stubs)
    judged = [b for b in bodies if "strict grader" in json.dumps(b["body"])]
    classified = [b for b in bodies if "use_activation" in b["body"]]  # the scorer's body
    assert judged and classified, "the fuzzer never reached the judge or classify scorer"
