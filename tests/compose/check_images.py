"""Checks of the built images (tests/compose/run.sh): non-root, volumes, healthcheck, the
entrypoint as users meet it, and vLLM finding grm-service's plugin through its entry point.

    python tests/compose/check_images.py --docker /usr/bin/docker grm-service:cpu grm-service:gpu
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

# Run inside the image: the entry point as installed, then vLLM's own plugin loader calling it.
PLUGIN_PROBE = """
import json, logging, os
from importlib.metadata import entry_points
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
(ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "grm_service"]
from vllm.plugins import load_general_plugins
load_general_plugins()
print(json.dumps({"entry_point": ep.value, "uid": os.getuid()}))
"""


def docker(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=600,
                          check=False)


def check_config(binary: str, image: str) -> dict[str, Any]:
    result = docker(binary, "image", "inspect", image)
    assert result.returncode == 0, result.stderr
    (info,) = json.loads(result.stdout)
    config = info["Config"]
    assert config["User"] == "10001:10001", config["User"]
    assert config["Entrypoint"] == ["grm-entrypoint"] and config["Cmd"] == ["serve"], config
    assert config["Healthcheck"]["Test"] == ["CMD", "grm-entrypoint", "healthcheck"], config
    assert {"/models", "/cache"} <= set(config["Volumes"] or {}), config["Volumes"]
    return {"image": image, "size_mb": round(info["Size"] / 1e6)}


def check_entrypoint(binary: str, image: str) -> None:
    bare = docker(binary, "run", "--rm", image)
    assert bare.returncode == 64, (bare.returncode, bare.stderr)
    assert "set GRM_MODEL" in bare.stderr, bare.stderr
    helped = docker(binary, "run", "--rm", "-e", "GRM_MODEL=/models/x", image, "serve", "--help")
    assert helped.returncode == 0 and "Usage" in helped.stdout, helped.stdout + helped.stderr
    # The replica verb, and `backend`, its old name, which still reaches the same check.
    for verb in ("replica", "backend"):
        bare_replica = docker(binary, "run", "--rm", image, verb)
        assert bare_replica.returncode == 64, (verb, bare_replica.returncode, bare_replica.stderr)
        assert "for the replica" in bare_replica.stderr, (verb, bare_replica.stderr)


def check_plugin(binary: str, image: str) -> None:
    # As in a replica: the engine profile marks the replicas it starts, the plugin acts only there.
    probe = docker(binary, "run", "--rm", "-e", "GRM_SERVICE_REPLICA=1", "--entrypoint", "python3",
                   image, "-c", PLUGIN_PROBE)
    assert probe.returncode == 0, probe.stderr[-3000:]
    report = json.loads(probe.stdout.strip().splitlines()[-1])
    expected = {"entry_point": "grm_service.engine_side.vllm_plugin:register", "uid": 10001}
    assert report == expected, report
    # vLLM's loader called register(): on a CPU it decides to stay idle and says why.
    assert "grm_service vLLM plugin idle" in probe.stderr, probe.stderr[-3000:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docker", default="docker")
    parser.add_argument("images", nargs="+")
    args = parser.parse_args()
    for image in args.images:
        sized = check_config(args.docker, image)
        check_entrypoint(args.docker, image)
        check_plugin(args.docker, image)
        print(f"image ok: {sized['image']} ({sized['size_mb']} MB): uid 10001, volumes, "
              "healthcheck, entrypoint, vLLM plugin entry point", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
