"""Build the environments the client distribution is tested in (tests/client_dist): its wheel
(client/), installed with nothing but its declared dependencies into a fresh venv of Python 3.10
and one of 3.11, and a 3.10 venv with the `verl-omni` extra and pytest, where the adapters' unit
tests run.

    .venv/bin/python tests/support/client_env.py [.venv-client]
    GRM_CLIENT_ENV=.venv-client .venv/bin/python -m pytest tests/client_dist

The interpreters are pyenv's (`~/.pyenv/versions/3.10.*`, `3.11.*`): a trainer's environment is
often not the server's Python. `ready` is written last, so a half-built folder is never tested.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("3.10", "3.11")
# The adapters' unit tests, as the server's dev extra pins their runner.
TEST_TOOLS = ("pytest>=8,<9.2", "pytest-asyncio>=0.23", "pytest-xdist>=3.6")


def run(*argv: str | Path) -> None:
    subprocess.run([str(a) for a in argv], check=True, cwd=ROOT)


def interpreter(version: str) -> Path:
    found = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python"),
                   key=lambda p: [int(n) for n in p.parts[-3].split(".")])
    if not found:
        raise SystemExit(f"no Python {version} under ~/.pyenv/versions: pyenv install {version}")
    return found[-1]


def wheel(dest: Path) -> Path:
    """The client wheel, built from client/ (hatchling in pip's isolated build env)."""
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", dest / "dist",
        ROOT / "client")
    return next((dest / "dist").glob("grm_service_client-*.whl"))


def venv(python: Path, where: Path, *install: str | Path) -> None:
    run(python, "-m", "venv", where)
    run(where / "bin" / "pip", "install", "--quiet", *install)


def main() -> int:
    dest = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / ".venv-client").resolve()
    started = time.monotonic()
    shutil.rmtree(dest, ignore_errors=True)
    built = wheel(dest)
    for version in VERSIONS:
        venv(interpreter(version), dest / version, built)
    venv(interpreter("3.10"), dest / "3.10-tests", f"{built}[verl-omni]", *TEST_TOOLS)
    (dest / "ready").write_text(f"{built.name}\n")
    sys.stdout.write(f"client venvs ready in {time.monotonic() - started:.0f} s: {dest}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
