"""verl-omni's calls of `compute_score_ocr` through a gateway on STUB replicas (the thing under
test is the adapter's path to the engine, not the engine): the sampling its reward manager passes
once a reward model is configured, the seed of its determinism switch mapped in `reward_kwargs`,
and the check of its "Deterministic Post-Training" page: the same seed, two runs, the same
`rm_scores` bit for bit. A STUB answers with a text derived from the request bytes, so a seed
that reached it shows in the transcript; that the engine itself repeats its bits is held by the
engine tests (tests/integration/test_score_engine.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from grm_service.integrations import verl_omni
from tests.support.engines import COMPUTE_REPEATS
from tests.support.procs import Proc, gateway_on_stubs, received

SEED = 1234
# verl-omni's VisualRewardManager, a reward model configured: its reward_model.rollout sampling,
# and reward_model.seed once reward_model.full_determinism is on.
PASSED = {"temperature": 1.0, "top_k": -1, "top_p": 1, "max_tokens": 2048}
MANAGER = {"reward_router_address": "127.0.0.1:1", "reward_model_tokenizer": object(),
           "model_name": "/models/qwen3-vl"}
# As long as a STUB transcript ("stub-" and 16 hex digits): the OCR reward varies with it.
TRUTH = "stub-0123456789abcdef"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            stub_pair: list[Proc]) -> Iterator[tuple[Proc, list[Proc]]]:
    # Every call reaches a replica once: none is answered from the ledger or re-run by the audit.
    env = {"GRM_AUDIT_FRACTION": "0", **COMPUTE_REPEATS}
    with gateway_on_stubs(tmp_path_factory.mktemp("verl-omni"), env=env,
                          shared=stub_pair) as pair:
        yield pair


def samples() -> list[torch.Tensor]:
    """Three generated images, uint8 (C, H, W), as verl-omni's test makes them."""
    torch.manual_seed(42)
    return [torch.randint(0, 256, (3, 24, 32), dtype=torch.uint8) for _ in range(3)]


def engine_bodies(stubs: list[Proc]) -> list[dict[str, Any]]:
    """The chat bodies the replicas were sent since the last look."""
    bodies = [r["body"] for r in received(stubs) if str(r["path"]).endswith("/completions")]
    received(stubs, clear=True)
    return bodies  # type: ignore[return-value]


def engine_seeds(stubs: list[Proc]) -> list[Any]:
    return [body.get("seed") for body in engine_bodies(stubs)]


async def run(url: str, **kwargs: Any) -> list[dict[str, Any]]:
    """One run: every sample's call at once, as a reward worker makes them; its own clients."""
    calls = [verl_omni.compute_score_ocr(data_source="ocr", solution_image=image,
                                         ground_truth=TRUTH, extra_info={}, url=url, **kwargs)
             for image in samples()]
    try:
        return list(await asyncio.gather(*calls))
    finally:
        await verl_omni.close_clients()


def rm_scores(infos: list[dict[str, Any]]) -> torch.Tensor:
    """verl-omni's `rm_scores`: one float32 reward per sample, shape (batch, 1)."""
    return torch.tensor([i["score"] for i in infos], dtype=torch.float32).unsqueeze(-1)


async def test_the_managers_sampling_and_seed_reach_the_engine(
    gateway: tuple[Proc, list[Proc]]
) -> None:
    gw, stubs = gateway
    received(stubs, clear=True)
    infos = await run(gw.url, sampling_params={**PASSED, "seed": SEED}, **MANAGER)
    bodies = engine_bodies(stubs)
    assert len(bodies) == 3 and all(i["grm_error"] == 0.0 for i in infos)
    for body in bodies:
        assert {k: body[k] for k in [*PASSED, "seed"]} == {**PASSED, "seed": SEED}


async def test_the_switch_in_reward_kwargs_sets_the_seed_only_when_on(
    gateway: tuple[Proc, list[Proc]]
) -> None:
    gw, stubs = gateway
    received(stubs, clear=True)
    await run(gw.url, full_determinism=True, seed=SEED)
    assert engine_seeds(stubs) == [SEED] * 3
    await run(gw.url, full_determinism=False, seed=SEED)
    assert engine_seeds(stubs) == [42] * 3, "off: the service's own seed, as verl-omni's"


async def test_same_seed_two_runs_same_rm_scores_bit_for_bit(
    gateway: tuple[Proc, list[Proc]]
) -> None:
    gw, stubs = gateway
    received(stubs, clear=True)
    first, second = [await run(gw.url, full_determinism=True, seed=SEED) for _ in range(2)]
    other = await run(gw.url, full_determinism=True, seed=SEED + 1)
    assert engine_seeds(stubs) == [SEED] * 6 + [SEED + 1] * 3, "both runs reached a replica"
    assert torch.equal(rm_scores(first), rm_scores(second))
    assert [i["genrm_response"] for i in first] == [i["genrm_response"] for i in second]
    assert not set(i["genrm_response"] for i in first) & {i["genrm_response"] for i in other}
    assert len(set(rm_scores(first).flatten().tolist())) > 1, "the rewards differ by image"
