"""The engine tests share the replicas of tests/support/engines.py.

The tests that need engines run last, grouped by the recipe they use, in ORDER below, so that each
recipe is up for one stretch of the run and stopped after its last user. Recipes start ahead of
their first user where memory allows (PRESTART_*): the first ones as the run begins, coming up
while the faster tests run.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.engines import LAUNCHED, EnginePool, Replica
from tests.support.procs import Proc, start_stub

# The engine modules, in the order they run: the classifier's users first, then the users of the
# launched service's text replicas (both recipes start with the run): the police and Ray with
# engines of their own besides, NeMo Gym's (late: its client's venv is built beside the suite),
# the group judges, the replica-killing chaos last of them (a group judged across its kill: after
# it the text replicas' addresses may be others, so no test that attaches to them comes later),
# then the VLM's, whose replicas start during chaos. At most six engines run at once (about
# 2.2 GiB each here).
ORDER = [
    "test_score_classify.py", "test_engine_cpu.py", "test_integrations.py",
    "test_determinism_police.py", "test_ray_launcher.py", "test_gym_engine.py",
    "test_groups_engine.py", "test_chaos.py",
    "test_score_engine.py", "test_cli_score.py", "test_score_reward_head.py",
    "test_score_clip.py",
]
PRESTART_AT_START = ("classifier", LAUNCHED)
PRESTART_DURING = {"test_chaos.py": ("vlm",), "test_score_engine.py": ("vlm-reward",),
                   "test_cli_score.py": ("clip",)}
# Fixture -> the recipe it holds. The text tests' replicas are the launched service's.
RECIPE_OF = {"text_backends": LAUNCHED, "vlm_backends": "vlm",
             "classifier_backend": "classifier", "launched_text": LAUNCHED,
             "vlm_reward_backends": "vlm-reward", "clip_backends": "clip"}
POOL = pytest.StashKey[EnginePool]()
LAST_USE = pytest.StashKey[dict[str, int]]()


def _engine_rank(item: pytest.Item) -> int:
    name = item.path.name
    return ORDER.index(name) + 1 if name in ORDER else 0


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_engine_rank)  # stable: the order within each module is kept
    # Under xdist (`-n 2 --dist loadgroup`, the default): the engine tests on one worker, in this
    # order, sharing its pool; everything else on the other, beside them.
    for item in items:
        item.add_marker(pytest.mark.xdist_group("engines" if _engine_rank(item) else "light"))


def _recipes(item: pytest.Item) -> set[str]:
    return {RECIPE_OF[f] for f in getattr(item, "fixturenames", ()) if f in RECIPE_OF}


def pytest_collection_finish(session: pytest.Session) -> None:
    if getattr(session.config.option, "loadgroup", False) and session.items:
        grouped = session.items[0].nodeid.rsplit("@", 1)[-1] in ("engines", "light")
        if not grouped:  # the engine tests would be spread over workers, each with engines
            raise pytest.UsageError("pytest-xdist's --dist loadgroup did not group the tests "
                                    "(pytest >= 9.2, pytest-xdist #1386): install pytest<9.2, "
                                    "or run with -n 0")
    pool = EnginePool()
    session.config.stash[POOL] = pool
    last: dict[str, int] = {}
    for index, item in enumerate(session.items):
        for recipe in _recipes(item):
            last[recipe] = index
    session.config.stash[LAST_USE] = last
    # Serially, the engine tests come last: their first recipes start with the run. An xdist
    # worker only learns that it runs them from its first engine test (below).
    if not session.config.option.collectonly and not hasattr(session.config, "workerinput"):
        _prestart(pool, PRESTART_AT_START, set(last))


def _prestart(pool: EnginePool, recipes: tuple[str, ...], wanted: set[str]) -> None:
    for recipe in recipes:
        if recipe in wanted:
            pool.prestart(recipe)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A module's first test: prestart what the modules after it need (not used before)."""
    items = item.session.items
    index = items.index(item)
    if index and items[index - 1].path == item.path:
        return
    if _engine_rank(item) and not (index and _engine_rank(items[index - 1])):
        _prestart(item.config.stash[POOL], PRESTART_AT_START,
                  {r for it in items[index:] for r in _recipes(it)})
    later = {r for it in items[index:] if it.path != item.path for r in _recipes(it)}
    _prestart(item.config.stash[POOL], PRESTART_DURING.get(item.path.name, ()), later)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield  # the module's gateways are stopped by now
    index = item.session.items.index(item)
    pool = item.config.stash[POOL]
    for recipe, last in item.config.stash[LAST_USE].items():
        if last == index:
            pool.release(recipe)


def pytest_unconfigure(config: pytest.Config) -> None:
    if POOL in config.stash:
        config.stash[POOL].close()


@pytest.fixture(scope="session")
def stub_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Proc]]:
    """Two recording STUB backends shared by the gateway tests' gateways (`gateway_on_stubs(...,
    shared=stub_pair)` clears their records for each). A test that needs other STUB behaviour
    (delays, garbage, held requests) starts its own."""
    tmp = tmp_path_factory.mktemp("stubs")
    stubs = [start_stub(tmp, "--record", "100000") for _ in range(2)]
    yield stubs
    for stub in stubs:
        stub.stop()


@pytest.fixture(scope="session")
def engine_pool(request: pytest.FixtureRequest) -> EnginePool:
    return request.config.stash[POOL]


@pytest.fixture(scope="session")
def text_backends(engine_pool: EnginePool) -> list[Replica]:
    """The launched service's two text replicas, for a test's own gateway to attach to."""
    return engine_pool.launched_replicas()


@pytest.fixture(scope="session")
def vlm_backends(engine_pool: EnginePool) -> list[Proc]:
    return engine_pool.backends("vlm")


@pytest.fixture(scope="session")
def classifier_backend(engine_pool: EnginePool) -> Proc:
    return engine_pool.backends("classifier")[0]


@pytest.fixture(scope="session")
def vlm_reward_backends(engine_pool: EnginePool) -> list[Proc]:
    return engine_pool.backends("vlm-reward")


@pytest.fixture(scope="session")
def clip_backends(engine_pool: EnginePool) -> list[Proc]:
    return engine_pool.backends("clip")


@pytest.fixture
def launched_text(engine_pool: EnginePool) -> Proc:
    """Function scope: a test that killed the service's gateway leaves it to be launched anew."""
    return engine_pool.service()
