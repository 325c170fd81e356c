"""Build the environment the trainer tests run in (tests/trainers): grm-service without an
engine, next to TRL, verl and OpenRLHF as PyPI ships them.

    python3 tests/support/trainers_env.py [.venv-trainers]
    .venv-trainers/bin/python -m pytest tests/trainers

Why a venv of its own: verl 0.9.1 pins transformers<5.11 (the CPU engine's venv has a newer
one), and OpenRLHF 0.11.2 pins flash-attn and deepspeed, which only build against CUDA, plus
transformers==5.15.0 and ray==2.55.0. OpenRLHF therefore goes in with --no-deps: its reward path
(`openrlhf.utils.agent`) needs only aiohttp, torch, transformers, sympy and pylatexenc, which the
other two bring. torch is the same CPU build as the engine venv's, so nothing large is fetched.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0+cpu"
OPENRLHF = "openrlhf==0.11.2"


def run(*argv: str | Path) -> None:
    subprocess.run([str(a) for a in argv], check=True, cwd=ROOT)


def build(venv: Path) -> None:
    run(sys.executable, "-m", "venv", venv)
    pip = venv / "bin" / "pip"
    run(pip, "install", "--quiet", TORCH, "-e", f"{ROOT}[trainers]")
    run(pip, "install", "--quiet", "--no-deps", OPENRLHF)
    run(venv / "bin" / "python", "-c", "import trl, verl, openrlhf.utils.agent")


def main() -> int:
    venv = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / ".venv-trainers").resolve()
    started = time.monotonic()
    build(venv)
    sys.stdout.write(f"trainers venv ready in {time.monotonic() - started:.0f} s: {venv}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
