from __future__ import annotations

import pytest

from grm_service.canonical import canonical_json
from grm_service.errors import UnknownReplica
from grm_service.gateway.request import router
from grm_service.replicas.pool import Replica, ReplicaPool, ReplicaState

REPLICAS = ["r0", "r1", "r2", "r3"]


@pytest.mark.parametrize(
    ("body_a", "body_b"),
    [
        ({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}),
        ({"x": {"z": 1, "y": 2}}, {"x": {"y": 2, "z": 1}}),
    ],
)
def test_key_ignores_key_order_and_whitespace(body_a: dict, body_b: dict) -> None:
    assert canonical_json(body_a) == canonical_json(body_b)
    assert router.request_key(body_a) == router.request_key(body_b)


def test_canonical_json_table() -> None:
    assert canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()
    assert router.request_key({"seed": 1}) != router.request_key({"seed": 2})


# (key, replicas) -> expected first choice. Pinned values: a change here changes which replica
# serves existing traffic, so it must be deliberate.
TABLE = [
    (0, ["r0", "r1"], "r0"),
    (4, ["r0", "r1"], "r1"),
    (3, ["r0", "r1", "r2"], "r2"),
    (12345, ["r0", "r1", "r2"], "r2"),
    (0xFFFFFFFF, ["r0", "r1", "r2", "r3"], "r3"),
    (7, ["r0"], "r0"),
]


@pytest.mark.parametrize(("key", "replicas", "expected"), TABLE)
def test_pick_table(key: int, replicas: list[str], expected: str) -> None:
    assert router.pick(key, replicas) == expected


def test_pick_none_without_replicas() -> None:
    assert router.pick(5, []) is None


def test_pick_ignores_replica_order() -> None:
    for key in range(200):
        assert router.pick(key, REPLICAS) == router.pick(key, list(reversed(REPLICAS)))


def test_removing_a_replica_moves_only_its_keys() -> None:
    keys = [router.request_key({"i": i}) for i in range(5000)]
    before = {k: router.pick(k, REPLICAS) for k in keys}
    after = {k: router.pick(k, ["r0", "r1", "r3"]) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved, "r2 owned no key at all"
    assert all(before[k] == "r2" for k in moved)
    assert all(after[k] == before[k] for k in keys if before[k] != "r2")


def test_adding_a_replica_takes_keys_only_for_itself() -> None:
    keys = [router.request_key({"i": i}) for i in range(5000)]
    before = {k: router.pick(k, REPLICAS) for k in keys}
    after = {k: router.pick(k, [*REPLICAS, "r4"]) for k in keys}
    assert all(after[k] in (before[k], "r4") for k in keys)


def test_balance_is_close_to_uniform() -> None:
    keys = [router.request_key({"prompt": f"p{i}"}) for i in range(8000)]
    counts = {r: 0 for r in REPLICAS}
    for key in keys:
        counts[router.pick(key, REPLICAS) or ""] += 1
    assert all(abs(c / len(keys) - 0.25) < 0.03 for c in counts.values()), counts


def test_least_loaded_prefers_idle_then_rendezvous() -> None:
    load = {"r0": 3, "r1": 0, "r2": 0, "r3": 1}
    order = router.least_loaded_order(99, REPLICAS, load.__getitem__)
    assert set(order[:2]) == {"r1", "r2"}
    assert order[2:] == ["r3", "r0"]
    tied = [r for r in router.rendezvous_order(99, REPLICAS) if r in ("r1", "r2")]
    assert order[:2] == tied


def _pool(names: list[str], down: tuple[str, ...] = ()) -> ReplicaPool:
    return ReplicaPool([Replica(n, f"http://{n}",
                                state=ReplicaState.DOWN if n in down else ReplicaState.READY)
                        for n in names])


@pytest.mark.parametrize("key", [0, 7, 2**31 + 5, 2**32 - 1])
def test_route_is_a_function_of_the_key_and_the_healthy_replicas(key: int) -> None:
    """The pool's order and its replicas that are not ready change nothing: the same key goes
    where the rendezvous order of the ready names sends it."""
    order = [r.name for r in router.route(_pool(REPLICAS), key, False)]
    assert order == router.rendezvous_order(key, REPLICAS)
    idle = [r.name for r in router.route(_pool(REPLICAS), key, True)]
    assert idle == router.least_loaded_order(key, REPLICAS, lambda _: 0)
    shuffled = _pool(["x9", *reversed(REPLICAS), "x8"], down=("x8", "x9"))
    assert [r.name for r in router.route(shuffled, key, False)] == order
    assert router.route(_pool(REPLICAS, down=tuple(REPLICAS)), key, False) == []


def test_a_pin_names_a_replica_or_is_refused_with_the_known_ones() -> None:
    pool = _pool(REPLICAS, down=("r1",))
    assert [r.name for r in router.route(pool, 7, False, pin="r2")] == ["r2"]
    assert router.route(pool, 7, False, pin="r1") == []  # named, not ready: none to try
    with pytest.raises(UnknownReplica, match="replicas: r0, r1, r2, r3"):
        router.route(pool, 7, False, pin="r9")
