"""The `clip` scorer: the model's own logit from two embeddings, bitwise in any order; group
softmax; options and items refused before any item runs."""

from __future__ import annotations

import hashlib
import math
import random
import struct
from typing import Any

import pytest

from grm_service.dual_scales import DualScales
from grm_service.errors import InvalidRequest
from grm_service.gateway.request.checkpoint import check_body
from grm_service.scoring import clip
from grm_service.scoring.batch import score_batch
from grm_service.scoring.context import EMBED_PATH, Reply
from grm_service.scoring.models import ScoreRequest
from grm_service.scoring.registry import check_request, finish_of, lookup
from tests.support.scoring import LIMITS, data_url, fingerprint

CLIP = DualScales("CLIPModel", 3.25)
SIGLIP = DualScales("SiglipModel", 3.25, -7.5)
DIM = 48


def vector(seed: bytes) -> list[float]:
    """float32 values (as an engine sends them), a function of `seed`."""
    rng = random.Random(hashlib.sha256(seed).digest())
    return [struct.unpack("<f", struct.pack("<f", rng.uniform(-1, 1)))[0] for _ in range(DIM)]


class Embedder:
    """A `Send` for /v1/embeddings whose vector is a function of the body (checked first)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, path: str, body: dict[str, Any]) -> Reply:
        assert path == EMBED_PATH
        check_body(path, body, LIMITS)
        self.calls.append(body)
        payload = {"data": [{"index": 0, "object": "embedding",
                             "embedding": vector(repr(sorted(body.items())).encode())}]}
        return payload, fingerprint(body, payload)


def items(n: int, group: str | None = None) -> list[dict[str, Any]]:
    return [{"id": f"i{k}", "image": data_url(f"IMG{k}"), "prompt": f"a photo of {k % 3}",
             **({"group_id": group} if group else {})} for k in range(n)]


async def run(req: ScoreRequest, scales: DualScales | None = CLIP,
              concurrency: int = 8) -> Any:
    scorer = lookup(req.scorer)
    check_request(req.scorer, scorer, req)
    return await score_batch(req, scorer, Embedder(), concurrency, "grm-test",
                             scales=scales, finish=finish_of(req.scorer, scorer))


def request(its: list[dict[str, Any]], **options: Any) -> ScoreRequest:
    return ScoreRequest.model_validate({"scorer": "clip", "items": its, "options": options})


async def test_score_is_the_models_logit_over_both_embeddings() -> None:
    send = Embedder()
    one = items(1)
    answer = await score_batch(request(one), lookup("clip"), send, 1, "grm-test", scales=CLIP)
    image_body, text_body = send.calls
    assert image_body["messages"][0]["content"][0]["image_url"]["url"] == one[0]["image"]
    assert text_body == {"input": one[0]["prompt"]}
    a = vector(repr(sorted(image_body.items())).encode())
    b = vector(repr(sorted(text_body.items())).encode())
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    cos = dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    assert answer.results[0].score == pytest.approx(math.exp(3.25) * cos, rel=1e-12)
    siglip = await run(request(one), SIGLIP)
    assert siglip.results[0].score == pytest.approx(math.exp(3.25) * cos - 7.5, rel=1e-12)
    hps = await run(request(one, output="cosine"))
    assert hps.results[0].score == pytest.approx(cos, rel=1e-12)
    fp = answer.results[0].fingerprint
    assert fp is not None and len(fp.request_digest) > 0, "both requests fingerprinted"


def test_cosine_bits_do_not_depend_on_the_order_of_components() -> None:
    """fsum is exactly rounded: the same bits for any order (a plain sum would differ)."""
    a, b = vector(b"a"), vector(b"b")
    order = list(range(DIM))
    naive = set()
    for seed in range(20):
        random.Random(seed).shuffle(order)
        pa, pb = [a[i] for i in order], [b[i] for i in order]
        assert clip.cosine(pa, pb).hex() == clip.cosine(a, b).hex()
        naive.add(sum(x * y for x, y in zip(pa, pb, strict=True)).hex())
    assert len(naive) > 1, "the check would not see an order-dependent sum"


async def test_scores_are_bitwise_at_any_concurrency_and_order() -> None:
    base = items(12)
    one = await run(request(base), concurrency=1)
    shuffled = list(base)
    random.Random(3).shuffle(shuffled)
    many = await run(request(shuffled), concurrency=64)
    by_id = {r.id: r for r in many.results}
    for r in one.results:
        assert r.score is not None and r.score.hex() == by_id[r.id].score.hex()
        assert r.digest == by_id[r.id].digest


async def test_softmax_over_the_request_or_each_group_in_canonical_order() -> None:
    plain = await run(request(items(5)))
    soft = await run(request(items(5), softmax=True))
    logits = [r.score for r in plain.results]
    probs = [r.score for r in soft.results]
    assert math.fsum(probs) == pytest.approx(1.0, abs=1e-15)
    top = max(logits)
    expected = [math.exp(v - top) / math.fsum(math.exp(w - top) for w in logits) for v in logits]
    assert probs == pytest.approx(expected, rel=1e-14)
    assert [r.digest for r in soft.results] != [r.digest for r in plain.results], \
        "the digest is over the probability"
    reversed_items = list(reversed(items(5)))
    again = await run(request(reversed_items, softmax=True))
    assert {r.id: r.score.hex() for r in again.results if r.score is not None} == \
        {r.id: r.score.hex() for r in soft.results if r.score is not None}
    grouped = await run(request(items(3, "g1") + [
        {**it, "id": f"x{k}", "group_id": "g2"} for k, it in enumerate(items(2))], softmax=True))
    g1 = [r.score for r in grouped.results if r.id.startswith("i")]
    g2 = [r.score for r in grouped.results if r.id.startswith("x")]
    assert math.fsum(g1) == pytest.approx(1.0) and math.fsum(g2) == pytest.approx(1.0)


async def test_a_failed_member_fails_its_group_softmax() -> None:
    its = items(3)
    its[1]["image"] = "https://example.com/cat.png"  # refused per item: not inline
    answer = await run(request(its, softmax=True))
    assert [r.status for r in answer.results] == ["error"] * 3
    assert "item 'i1' of this group failed" in str(answer.results[0].error)
    assert "inline" in str(answer.results[1].error)


async def test_no_dual_encoder_is_an_item_error() -> None:
    answer = await run(request(items(1)), scales=None)
    assert answer.results[0].status == "error"
    assert "logit_scale" in str(answer.results[0].error)


@pytest.mark.parametrize(("its", "options", "words"), [
    (items(1), {"temperature": 1}, "unknown temperature"),
    (items(1), {"softmax": "yes"}, "softmax must be true or false"),
    (items(1), {"output": "prob"}, "output must be 'logit' or 'cosine'"),
    ([{"id": "a", "image": data_url()}], {}, "has an image and no prompt"),
    ([{"id": "a", "prompt": "p"}], {}, "has no image and a prompt"),
    ([{"id": "a", "prompt": "p", "image": [data_url(), data_url()]}], {}, "a list of images"),
    ([{**it, "group_id": "g", "group_size": 4} for it in items(2)], {"softmax": True},
     "group_size 4 but this request has 2"),
])
def test_bad_requests_are_refused_before_any_item(its: list[dict[str, Any]],
                                                  options: dict[str, Any], words: str) -> None:
    req = request(its, **options)
    with pytest.raises(InvalidRequest, match=words):
        check_request("clip", lookup("clip"), req)


def test_softmax_bits_do_not_depend_on_input_order() -> None:
    values = [random.Random(k).uniform(-30, 30) for k in range(50)]
    ref = dict(zip(values, clip.softmax(values), strict=True))
    for seed in range(5):
        shuffled = list(values)
        random.Random(seed).shuffle(shuffled)
        assert all(p.hex() == ref[v].hex()
                   for v, p in zip(shuffled, clip.softmax(shuffled), strict=True))
