"""Build the environment the NeMo Gym tests run in (tests/gym): grm-service without an engine,
next to nemo-gym as PyPI ships it, on pyenv's Python 3.12.

    .venv/bin/python tests/support/gym_env.py [.venv-gym]
    .venv-gym/bin/python -m pytest tests/gym

Why a venv of its own: every nemo-gym release needs Python >= 3.12 (the server's venv is 3.11);
0.4.0 is the newest whose `Requires-Python` (>= 3.12) a 3.12 interpreter meets: 0.5.0 on asks
for >= 3.13.14. Why `--no-deps`: nemo-gym 0.4.0 requires mlflow, ray[default], datasets, wandb,
anthropic, mcp and more, over a gigabyte of wheels, for its CLI and its training integrations.
The modules a resources server's client touches (`base_resources_server`, `openai_utils`,
`server_utils` and what they import at module level) need only `GYM_IMPORTS`: ray's core, not
its dashboard; wandb and pandas because `global_config` and `reward_profile` import them.
`ready` is written last, so a half-built folder is never tested.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VERSION = "3.12"
NEMO_GYM = "nemo-gym==0.4.0"
GYM_IMPORTS = (
    "openai>=1.40,<=2.7.2", "orjson", "ray==2.60.0", "requests", "aiohttp>=3.14.1",
    "omegaconf", "hydra-core", "itsdangerous", "wandb", "pandas", "yappi", "gprof2dot",
    "pydot", "tqdm",
)
# The modules the tests use, imported once here: a missing dependency fails the build, naming it.
CHECK = ("import nemo_gym.base_resources_server, nemo_gym.openai_utils, nemo_gym.server_utils; "
         "import responses_api_agents.simple_agent.app")
TEST_TOOLS = ("pytest>=8,<9.2", "pytest-asyncio>=0.23", "pytest-xdist>=3.6")


def run(*argv: str | Path) -> None:
    subprocess.run([str(a) for a in argv], check=True, cwd=ROOT)


def interpreter(version: str) -> Path:
    found = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python"),
                   key=lambda p: [int(n) for n in p.parts[-3].split(".")])
    if not found:
        raise SystemExit(f"no Python {version} under ~/.pyenv/versions: pyenv install {version}")
    return found[-1]


def build(venv: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    run(interpreter(VERSION), "-m", "venv", venv)
    pip = venv / "bin" / "pip"
    run(pip, "install", "--quiet", "--no-deps", NEMO_GYM)
    run(pip, "install", "--quiet", *GYM_IMPORTS, *TEST_TOOLS, "-e", ROOT)
    run(venv / "bin" / "python", "-c", CHECK)
    (venv / "ready").write_text(f"{NEMO_GYM}\n")


def main() -> int:
    venv = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / ".venv-gym").resolve()
    started = time.monotonic()
    build(venv)
    sys.stdout.write(f"gym venv ready in {time.monotonic() - started:.0f} s: {venv}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
