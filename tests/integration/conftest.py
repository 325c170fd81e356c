"""The engine tests share the replicas of tests/support/engines.py.

The tests that need engines run last, grouped by the recipe they use, in ORDER below, so that each
recipe is up for one stretch of the run and stopped after its last user; the first recipe needed
starts as the run begins, and comes up while the faster tests run.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.engines import LAUNCHED, EnginePool
from tests.support.procs import Proc

# Module -> its place among the engine modules. Text-replica users first (the police and Ray
# start their own engines besides, so the text replicas go before them, then the launched service),
# the replica-killing chaos last of the text users; then the classifier and the VLM.
ORDER = [
    "test_engine_cpu.py", "test_integrations.py", "test_determinism_police.py",
    "test_ray_launcher.py", "test_chaos.py", "test_score_classify.py", "test_score_engine.py",
    "test_cli_score.py",
]
# Fixture -> the recipe it holds.
RECIPE_OF = {"text_backends": "text", "vlm_backends": "vlm",
             "classifier_backend": "classifier", "launched_text": LAUNCHED}
POOL = pytest.StashKey[EnginePool]()
LAST_USE = pytest.StashKey[dict[str, int]]()


def _engine_rank(item: pytest.Item) -> int:
    name = item.path.name
    return ORDER.index(name) + 1 if name in ORDER else 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_engine_rank)  # stable: the order within each module is kept


def _recipes(item: pytest.Item) -> set[str]:
    return {RECIPE_OF[f] for f in getattr(item, "fixturenames", ()) if f in RECIPE_OF}


def pytest_collection_finish(session: pytest.Session) -> None:
    pool = EnginePool()
    session.config.stash[POOL] = pool
    last: dict[str, int] = {}
    first: list[str] = []
    for index, item in enumerate(session.items):
        for recipe in _recipes(item):
            last[recipe] = index
            if recipe not in first:
                first.append(recipe)
    session.config.stash[LAST_USE] = last
    if first and not session.config.option.collectonly:
        pool.prestart(first[0])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield  # the module's gateways are stopped by now
    index = item.session.items.index(item)
    pool = item.config.stash[POOL]
    for recipe, last in item.config.stash[LAST_USE].items():
        if last == index:
            pool.release(recipe)


def release_if_last(request: pytest.FixtureRequest, fixture: str) -> None:
    """Stop a recipe early, from a module fixture that has taken what it needs, when no later
    module uses `fixture`: for a module that needs the memory for engines of its own."""
    path = request.node.path
    items = request.session.items
    first = next(i for i, item in enumerate(items) if item.path == path)
    recipe = RECIPE_OF[fixture]
    if all(recipe not in _recipes(item) for item in items[first:] if item.path != path):
        request.config.stash[POOL].release(recipe)


def pytest_unconfigure(config: pytest.Config) -> None:
    if POOL in config.stash:
        config.stash[POOL].close()


@pytest.fixture(scope="session")
def engine_pool(request: pytest.FixtureRequest) -> EnginePool:
    return request.config.stash[POOL]


@pytest.fixture(scope="session")
def text_backends(engine_pool: EnginePool) -> list[Proc]:
    return engine_pool.backends("text")


@pytest.fixture(scope="session")
def vlm_backends(engine_pool: EnginePool) -> list[Proc]:
    return engine_pool.backends("vlm")


@pytest.fixture(scope="session")
def classifier_backend(engine_pool: EnginePool) -> Proc:
    return engine_pool.backends("classifier")[0]


@pytest.fixture
def launched_text(engine_pool: EnginePool) -> Proc:
    """Function scope: a test that killed the service's gateway leaves it to be launched anew."""
    return engine_pool.service()
