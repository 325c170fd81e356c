"""Pooling co-batching: admitted only where the profile declares it and the replica proves it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from grm_service import tiny_dual, tiny_models
from grm_service.config import SerializeMode, Settings
from grm_service.engine_side.identity import ReplicaIdentity
from grm_service.engines import Capabilities
from grm_service.gateway.request.alone import pooling_alone
from grm_service.metrics import Metrics
from grm_service.replicas.pool import Replica
from grm_service.replicas.pooling_canary import PoolingCanary

POOLING = Capabilities(batch_invariant=True, sampling_invariant=True, note="",
                       pooling_invariant=True)
NO_POOLING = Capabilities(batch_invariant=True, sampling_invariant=True, note="")


def engine(shift_when_batched: float = 0.0, offset: float = 0.0,
           status: int = 200) -> httpx.MockTransport:
    """A /classify whose output is a function of the text, plus `shift_when_batched` whenever
    another request is in flight at the same time (what a batch-variant kernel does)."""
    inflight = 0

    async def handle(request: httpx.Request) -> httpx.Response:
        nonlocal inflight
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "no such route"}})
        inflight += 1
        await asyncio.sleep(0.001)
        shared = inflight > 1
        inflight -= 1
        text = json.loads(request.content)["input"]
        prob = len(text) / 1000 + offset + (shift_when_batched if shared else 0.0)
        return httpx.Response(200, json={"data": [{"index": 0, "probs": [prob]}]})

    return httpx.MockTransport(handle)


def identity(version: str = "0.25.0", batch_invariant: str = "1",
             engine: str = "vllm") -> ReplicaIdentity:
    """What a GPU vLLM replica reports about itself (`/grm/identity`)."""
    env = {"VLLM_BATCH_INVARIANT": batch_invariant}
    return ReplicaIdentity(verified=True, served_model="m", engine=engine, engine_version=version,
                           model_hash="blake3:x", env_digest="e", device="NVIDIA H200",
                           tensor_parallel_size=1, env_inputs={"env": env})


def make_replica(name: str = "r0", ident: ReplicaIdentity | None = None) -> Replica:
    r = Replica(name, f"http://{name}")
    r.identity = ident or identity()
    return r


def check(**settings: object) -> PoolingCanary:
    return PoolingCanary(Settings(model="m", **settings), Metrics())  # type: ignore[arg-type]


async def run(c: PoolingCanary, replica: Replica, transport: httpx.MockTransport) -> str | None:
    async with httpx.AsyncClient(transport=transport) as client:
        return await c(replica, client)


async def test_invariant_replica_co_batches_pooling() -> None:
    replica = make_replica("r0")
    assert await run(check(), replica, engine()) is None
    assert replica.pooling_batched
    assert not pooling_alone(replica, POOLING, SerializeMode.AUTO)
    assert pooling_alone(replica, POOLING, SerializeMode.ON), "--serialize on wins"
    assert pooling_alone(replica, NO_POOLING, SerializeMode.AUTO), "the profile must agree"


async def test_batch_variant_replica_keeps_pooling_serialized() -> None:
    c = check()
    replica = make_replica("r0")
    assert await run(c, replica, engine(shift_when_batched=1e-9)) is None, "admitted"
    assert not replica.pooling_batched
    assert pooling_alone(replica, POOLING, SerializeMode.AUTO)
    violations = c.metrics.registry.get_sample_value("grm_determinism_violations_total",
                                                     {"source": "canary"})
    assert violations == 1.0


async def test_replica_disagreeing_with_the_first_one_is_refused() -> None:
    c = check()
    assert await run(c, make_replica("r0"), engine()) is None
    problem = await run(c, make_replica("r1"), engine(offset=1e-9))
    assert problem is not None and "first admitted replica" in problem


async def test_generative_replica_and_unproven_profiles_are_not_probed() -> None:
    replica = make_replica("r0")
    assert await run(check(), replica, engine(status=404)) is None
    assert not replica.pooling_batched
    calls = 0

    async def count(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(200, json={"data": [{"probs": [0.5]}]})

    unproven = [identity(version="0.26.0"), identity(batch_invariant="0"),
                identity(engine="vllm-cpu")]
    for c, r in [(check(), make_replica(ident=i)) for i in unproven] + [
            (check(serialize=SerializeMode.ON), make_replica())]:
        assert await run(c, r, httpx.MockTransport(count)) is None
        assert not r.pooling_batched
    assert calls == 0


def embedder(shift_images_when_batched: float = 0.0, images: bool = True
             ) -> tuple[httpx.MockTransport, list[str]]:
    """An embedding model (CLIP-shaped): no /classify; /v1/embeddings embeds `input` texts and,
    where `images`, chat messages with one image, whose vectors shift when co-batched."""
    inflight, seen = 0, []

    async def handle(request: httpx.Request) -> httpx.Response:
        nonlocal inflight
        if request.url.path != "/v1/embeddings":
            return httpx.Response(404, json={"error": {"message": "no such route"}})
        body = json.loads(request.content)
        kind = "text" if "input" in body else "image"
        if kind == "image" and not images:
            return httpx.Response(400, json={"error": {"message": "text-only model"}})
        seen.append(kind)
        inflight += 1
        await asyncio.sleep(0.001)
        shared = inflight > 1
        inflight -= 1
        value = len(json.dumps(body)) / 1e6
        if kind == "image" and shared:
            value += shift_images_when_batched
        return httpx.Response(200, json={"data": [{"index": 0, "embedding": [value, 1.0]}]})

    return httpx.MockTransport(handle), seen


async def test_an_embedding_model_is_probed_on_embeddings_with_texts_and_images() -> None:
    replica = make_replica("r0")
    transport, seen = embedder()
    assert await run(check(), replica, transport) is None
    assert replica.pooling_batched
    assert "image" in seen and "text" in seen
    text_only = make_replica("r1")
    transport, seen = embedder(images=False)
    assert await run(check(), text_only, transport) is None
    assert text_only.pooling_batched and set(seen) == {"text"}


@pytest.fixture(scope="module")
def clip_tokenizer() -> Any:
    """Made before the per-test os.environ check: importing torch (for the import hooks that
    go before transformers) sets TORCHINDUCTOR_CACHE_DIR in os.environ (third-party code)."""
    return tiny_dual._tokenizer(tiny_models.training_corpus(2000))


async def test_every_probe_fits_the_shortest_context_of_a_pooling_model(
        clip_tokenizer: Any) -> None:
    """SigLIP reads 64 tokens: an engine refuses a longer input (400), and a replica whose probe
    is refused is never admitted. Counted by the test models' CLIP tokenizer, whose 1,024
    pieces split words far more than a real CLIP's or SigLIP's."""
    tokenizer = clip_tokenizer
    seen: list[int] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/classify":
            return httpx.Response(404, json={"detail": "Not Found"})
        if "input" not in body:
            return httpx.Response(400, json={"error": {"message": "text only"}})
        tokens = len(tokenizer(body["input"])["input_ids"])
        seen.append(tokens)
        if tokens > 64:
            return httpx.Response(400, json={"error": {"message": "longer than 64 tokens"}})
        return httpx.Response(200, json={"data": [{"index": 0, "embedding": [tokens, 1.0]}]})

    replica = make_replica("r0")
    assert await run(check(canary_probes=64), replica, httpx.MockTransport(handle)) is None
    assert replica.pooling_batched
    assert len(seen) == 1 + 64 + 3 * 64 and len(set(seen)) >= 8, "shapes still differ"


async def test_an_image_tower_that_changes_when_co_batched_keeps_pooling_serialized(
        caplog: pytest.LogCaptureFixture) -> None:
    replica = make_replica("r0")
    transport, _ = embedder(shift_images_when_batched=1e-9)
    assert await run(check(), replica, transport) is None, "admitted"
    assert not replica.pooling_batched, "only the image probes moved: still caught"
    # The log names the tower: 4 text probes (the default), then 2 images.
    assert "2/6 outputs of r0 change when co-batched (image 0, image 1)" in caplog.text
