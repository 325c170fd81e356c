"""The seed of a request without one is decided once, in `forward`, for every path: a chat
body, a pooling body and a /v1/score item get the service's seed in their fingerprint, and a
sampling body carries it to the replica (a STUB replica: the gateway is under test)."""

from __future__ import annotations

from pathlib import Path

from grm_service.config import Settings
from grm_service.gateway.request.proxy import forward, prepare
from grm_service.gateway.request.send import make_send, pooling_body
from grm_service.scoring.context import CHAT_PATH, CLASSIFY_PATH
from tests.support.gateway import received, serving
from tests.support.procs import Proc

SEED = 1234
MSGS = [{"role": "user", "content": "the seed"}]


def settings(stub: Proc, tmp_path: Path) -> Settings:
    return Settings(replica_urls=[stub.url], served_model_name="rm", work_dir=tmp_path,
                    seed=SEED, audit_fraction=0.0, ledger=False)


async def test_every_path_without_a_seed_gets_the_one_derivation(stub: Proc,
                                                                  tmp_path: Path) -> None:
    async with serving(settings(stub, tmp_path)) as (_, fc):
        assert fc.identity.reference is not None
        await received(stub.url)
        chat = await forward(fc, CHAT_PATH, prepare({"messages": MSGS}, fc.request_settings))
        pooled = await forward(fc, CLASSIFY_PATH, pooling_body({"messages": MSGS}, "rm"))
        item = await make_send(fc)(CHAT_PATH, {"messages": MSGS, "temperature": 0.5})
        # A sampling body that did not pass `prepare` is seeded all the same.
        bare = await forward(fc, CHAT_PATH, {"messages": MSGS, "model": "rm", "max_tokens": 4})
        sent = await received(stub.url)
    fingerprints = [chat.fingerprint, pooled.fingerprint, item[1], bare.fingerprint]
    assert [f.seed for f in fingerprints] == [SEED] * 4
    expected = fc.identity.reference.fingerprint_id(SEED)
    assert [f.fingerprint_id for f in fingerprints] == [expected] * 4
    # A sampling body carries the seed to the replica; a pooling body takes none.
    assert [(r["path"], r["body"].get("seed")) for r in sent] == [
        (CHAT_PATH, SEED), (CLASSIFY_PATH, None), (CHAT_PATH, SEED), (CHAT_PATH, SEED)]


async def test_a_client_seed_is_kept_on_every_path(stub: Proc, tmp_path: Path) -> None:
    async with serving(settings(stub, tmp_path)) as (_, fc):
        chat = await forward(fc, CHAT_PATH, prepare({"messages": MSGS, "seed": 0},
                                                    fc.request_settings))
        pooled = await forward(fc, CLASSIFY_PATH,
                               pooling_body({"messages": MSGS, "seed": 9}, "rm"))
    assert (chat.fingerprint.seed, pooled.fingerprint.seed) == (0, 9)
