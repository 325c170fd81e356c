#!/bin/bash
# Issue 8 on the lent H200: device call 2 of the kit in ../shared/device/README.md, run from the
# repo root right after call 1 (`MODELS=text SIZE=small bash .stage/c1/device_stage1.sh`).
# Needs in .stage/c2/whl/: this project's wheel (for the vllm.general_plugins entry point) and
# pytest, pytest-asyncio, pluggy, iniconfig. Writes results and server logs to $OUT.
set -u -o pipefail
OUT=${OUT:-/tmp/grm-gpu}; mkdir -p "$OUT"
bash .stage/c2/device_setup.sh || exit 3
export PYTHONPATH=$PWD:/tmp/vsite PYTHONUNBUFFERED=1
export GRM_GPU_MODEL=${GRM_GPU_MODEL:-/tmp/models/text} GRM_GPU_LOG_DIR=$OUT
# GRM_GPU_BENCH_OUT= (empty) skips the throughput test and the BI=0 server.
export GRM_GPU_RESULTS=$OUT/topp.json GRM_GPU_BENCH_OUT=${GRM_GPU_BENCH_OUT-$OUT/bench.json}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pytest tests/gpu -p no:cacheprovider -v -rA 2>&1 | tee "$OUT/pytest.log"
