#!/bin/bash
# Issue 8, the whole service on the lent GPU: device call 2 of the kit (../shared/device/README.md),
# right after call 1 built the model (`MODELS=vl SIZE=1.5b bash .stage/c1/device_stage1.sh`).
# Runs tests/gpu/test_service_verify.py: `grm-service serve --engine vllm` fixed / unfixed (/ plain
# with GRM_GPU_BENCH=1) side by side, `verify` on both, throughput. Results: $OUT/service.json.
set -u -o pipefail
OUT=${OUT:-/tmp/grm-gpu}; mkdir -p "$OUT"
bash .stage/c2/device_setup.sh || exit 3
export PYTHONPATH=$PWD:/tmp/vsite PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export GRM_GPU_MODEL=${GRM_GPU_MODEL:-/tmp/models/vl} GRM_GPU_LOG_DIR=/tmp/grm-gpu-work
export GRM_GPU_RESULTS=$OUT/service.json
mkdir -p "$GRM_GPU_LOG_DIR"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${GRM_GPU_TIMEOUT:-540}" python3 -m pytest tests/gpu/test_service_verify.py \
  -p no:cacheprovider -v -rA 2>&1 | tee "$OUT/pytest-service.log"
# Gateway and replica logs, tails only (the device returns at most 8 files).
find "$GRM_GPU_LOG_DIR" -name '*.log' -print0 | while IFS= read -r -d '' f; do
  echo "=== $f"; tail -n 80 "$f"; done > "$OUT/logs.txt"
