"""Group scorers through a real gateway process on STUB replicas (the gateway is under test):
a STUB answers `stub-<sha256 of the body bytes>`, and the verdict patterns read a hex digit of
it, so any byte of a prompt, a pair's order or a seed that depended on arrival order would
change a reward."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from grm_service.scoring.groups.canon import content_digest, derive_seed
from grm_service.scoring.models import ScoreItem
from tests.support.groups import LISTWISE_HEX, PAIRWISE_HEX, group_items
from tests.support.procs import Proc, gateway_on_stubs, received

ENV = {"GRM_LEDGER_CACHE_SCORE": "false", "GRM_GROUP_MAX_SIZE": "16",
       "GRM_LEDGER_FLUSH_INTERVAL_S": "0.2", "GRM_GROUP_TIMEOUT_S": "1",
       "GRM_AUDIT_FRACTION": "0"}  # the stubs see the comparisons alone, no audit re-runs
CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("pairwise", PAIRWISE_HEX),
    ("pairwise", {**PAIRWISE_HEX, "strategy": "all_pairs", "both_orders": True}),
    ("listwise", LISTWISE_HEX),
]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, stub_pair: list[Proc]) -> Any:
    with gateway_on_stubs(tmp_path_factory.mktemp("groups"), env=ENV,
                          shared=stub_pair) as (gateway, stubs):
        yield gateway, stubs


def score(gateway: Proc, body: dict[str, Any], run: str | None = None) -> httpx.Response:
    headers = {"x-grm-run": run, "x-grm-step": "1"} if run else {}
    return httpx.post(gateway.url + "/v1/score", json=body, timeout=60, headers=headers)


def rewards(answer: dict[str, Any]) -> dict[str, tuple[str | None, str, str | None]]:
    """Each item's reward bits, digest and error."""
    return {r["id"]: (None if r["score"] is None else float(r["score"]).hex(), r["digest"],
                      r["error"]) for r in answer["results"]}


@pytest.mark.parametrize(("scorer", "options"), CONFIGS)
def test_a_groups_rewards_are_bitwise_the_same_in_any_order(
    service: tuple[Proc, list[Proc]], scorer: str, options: dict[str, Any]
) -> None:
    gateway, _ = service
    rng = random.Random(scorer + str(options))
    judged = []
    for size in (2, 4, 8):
        items = group_items(size, rng, group_id=f"g{size}")
        first = score(gateway, {"scorer": scorer, "items": items, "options": options}).json()
        assert all(r["status"] == "ok" or "response" in (r["error"] or "")
                   for r in first["results"]), first
        for _ in range(3):
            shuffled = rng.sample(items, len(items))
            again = score(gateway, {"scorer": scorer, "items": shuffled,
                                    "options": options}).json()
            assert [r["id"] for r in again["results"]] == [i["id"] for i in shuffled]
            assert rewards(again) == rewards(first)
        judged += [r for r in first["results"] if r["status"] == "ok"]
    assert judged and all(r["fingerprint"] and r["response"] for r in judged)


def test_each_comparison_is_sent_with_its_derived_seed_and_candidates_in_digest_order(
    service: tuple[Proc, list[Proc]],
) -> None:
    gateway, stubs = service
    received(stubs, clear=True)
    items = group_items(3, random.Random(9))
    answer = score(gateway, {"scorer": "pairwise", "items": items[::-1],
                             "options": PAIRWISE_HEX})
    assert answer.status_code == 200, answer.text
    bodies = [b["body"] for b in received(stubs)]
    digests = sorted(content_digest(ScoreItem.model_validate(i)) for i in items)
    by_digest = {content_digest(ScoreItem.model_validate(i)): i["completion"] for i in items}
    expected = {derive_seed(42, "pairwise", [digests[i], digests[j]]): (i, j)
                for i, j in ((0, 1), (0, 2), (1, 2))}
    assert sorted(b["seed"] for b in bodies) == sorted(expected)
    for body in bodies:
        i, j = expected[body["seed"]]
        text = body["messages"][0]["content"]
        assert text.index(by_digest[digests[i]]) < text.index(by_digest[digests[j]])


@pytest.mark.parametrize(("body", "message"), [
    ({"scorer": "pairwise", "options": {"strategy": "swiss"}, "items": [{"id": "a"}]},
     "strategy must be one of circular, all_pairs"),
    ({"scorer": "listwise", "options": {"pattern": "(x)"}, "items": [{"id": "a"}]},
     "two groups"),
    ({"scorer": "pairwise", "items": [{"id": str(n), "group_id": "g"} for n in range(17)]},
     "GRM_GROUP_MAX_SIZE"),
    ({"scorer": "pairwise", "items": [{"id": "a", "group_id": "g", "group_size": 2},
                                      {"id": "b", "group_id": "g", "group_size": 3}]},
     "different group_size"),
])
def test_bad_group_requests_are_400_naming_what_to_fix(
    service: tuple[Proc, list[Proc]], body: dict[str, Any], message: str
) -> None:
    gateway, stubs = service
    received(stubs, clear=True)
    answer = score(gateway, body)
    assert answer.status_code == 400 and message in answer.text, answer.text
    assert received(stubs) == []  # before any item ran


def test_an_incomplete_group_that_never_fills_is_each_items_error_and_pointwise_ignores_groups(
    service: tuple[Proc, list[Proc]],
) -> None:
    gateway, _ = service
    items = [{**i, "group_size": 4} for i in group_items(2, random.Random(1), "g")]
    held = score(gateway, {"scorer": "pairwise", "items": items}).json()
    assert [r["status"] for r in held["results"]] == ["error", "error"]
    # Held for the rest of the group, which never comes: GRM_GROUP_TIMEOUT_S (1 s here).
    assert "2 of its 4 items" in held["results"][0]["error"]
    assert "GRM_GROUP_TIMEOUT_S" in held["results"][0]["error"]
    pointwise = score(gateway, {"scorer": "judge", "items": items,
                                "options": {"pattern": "stub-([0-9])", "min": 0, "max": 9}})
    assert pointwise.status_code == 200 and len(pointwise.json()["results"]) == 2


def test_group_judgments_are_on_the_ledger_and_replay_bitwise(
    service: tuple[Proc, list[Proc]],
) -> None:
    gateway, _ = service
    items = group_items(4, random.Random(2), "g")
    for scorer, options in CONFIGS:
        answer = score(gateway, {"scorer": scorer, "items": items, "options": options},
                       run="groups")
        assert answer.status_code == 200
    time.sleep(1.5)  # past a flush of the ledger's writer
    port = gateway.url.rsplit(":", 1)[1]
    ledger = gateway.log.parent / f"work-{port}" / "ledger.sqlite"
    replayed = subprocess.run(
        [sys.executable, "-m", "grm_service.cli", "replay", str(ledger), "--url", gateway.url,
         "--run", "groups"], capture_output=True, text=True, timeout=300, check=False)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    # circular on 4: 4 pairs; all_pairs both orders: 12; listwise: 1
    row = next(line for line in replayed.stdout.splitlines() if "groups" in line)
    assert [c.strip() for c in row.split("│")[2:5]] == ["17", "17", "yes"], replayed.stdout


