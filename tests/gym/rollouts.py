"""A NeMo Gym client, run as Gym runs a rollout: nemo-gym's own request and response models and
its own HTTP clients (`ServerClient` and `NeMoGymAsyncOpenAI`, over its global aiohttp session),
with the service as the policy's OpenAI-compatible endpoint and as the resources server.

The steps are those of Gym's simple agent (`responses_api_agents/simple_agent/app.py`, `run`):
`/seed_session` on the resources server, the policy's Responses API call, then `/verify` with the
dataset row plus the policy's response; the answer is validated as the agent's verify response.
The policy's call is the one Gym's `openai_model` server sends upstream
(`responses_api_models/openai_model/app.py`: its `extra_body`, the body, its `openai_model` as
`model`, through `NeMoGymAsyncOpenAI.create_response` at `openai_base_url`). Rows carry
`_ng_task_index` and `_ng_rollout_index`, as Gym's rollout collection adds them. Needs nemo-gym
(.venv-gym, tests/support/gym_env.py):

    .venv-gym/bin/python tests/gym/rollouts.py http://127.0.0.1:8000 rows.jsonl MODEL

prints one verify response per row, as JSON lines, in the rows' order.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nemo_gym.config_types import BaseServerConfig
from nemo_gym.openai_utils import (
    NeMoGymAsyncOpenAI,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.server_utils import (
    GlobalAIOHTTPAsyncClientConfig,
    ServerClient,
    get_response_json,
    is_global_aiohttp_client_setup,
    raise_for_status,
    set_global_aiohttp_client,
)
from omegaconf import OmegaConf
from responses_api_agents.simple_agent.app import (
    SimpleAgentVerifyRequest,
    SimpleAgentVerifyResponse,
)

# The names a Gym config gives the servers; both point at the service here.
MODEL, RESOURCES = "grm_model", "grm_rewards"


def server_client(url: str) -> ServerClient:
    """Gym's client, its global config naming the service for both servers (what
    `ServerClient.load_from_global_config` reads from Gym's head server)."""
    parts = urlsplit(url)
    where = {"host": parts.hostname, "port": parts.port}
    config = OmegaConf.create({
        MODEL: {"responses_api_models": {MODEL: where}},
        RESOURCES: {"resources_servers": {RESOURCES: where}},
    })
    if not is_global_aiohttp_client_setup():  # as rollout collection sets it up
        set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())
    return ServerClient(head_server_config=BaseServerConfig(**where), global_config_dict=config)


def policy(url: str) -> NeMoGymAsyncOpenAI:
    """Gym's OpenAI client as its `openai_model` server builds it (`openai_base_url`)."""
    return NeMoGymAsyncOpenAI(base_url=f"{url}/v1", api_key="unused")


async def rollout(server: ServerClient, model: NeMoGymAsyncOpenAI, served: str,
                  row: dict[str, Any]) -> dict[str, Any]:
    """One row through the simple agent's steps; its verify response, validated."""
    seeded = await server.post(server_name=RESOURCES, url_path="/seed_session", json=row)
    await raise_for_status(seeded)
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate(
        row["responses_create_params"])
    answered = await model.create_response(**params.model_dump(exclude_unset=True) |
                                           {"model": served})
    response = NeMoGymResponse.model_validate(answered)
    asked = SimpleAgentVerifyRequest.model_validate(row | {"response": response.model_dump()})
    verified = await server.post(server_name=RESOURCES, url_path="/verify",
                                 json=asked.model_dump())
    await raise_for_status(verified)
    answer = SimpleAgentVerifyResponse.model_validate(await get_response_json(verified))
    return answer.model_dump(mode="json")


async def collect(url: str, served: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row's verify response, the rollouts in flight at once, as Gym runs them."""
    server, model = server_client(url), policy(url)
    return list(await asyncio.gather(*(rollout(server, model, served, row) for row in rows)))


def main() -> int:
    url, path, served = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for answer in asyncio.run(collect(url, served, rows)):
        sys.stdout.write(json.dumps(answer, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
