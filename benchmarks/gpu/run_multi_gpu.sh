#!/bin/bash
# Issue 22 on the lent GPUs: device call 2 (and 3, 4) of the kit (../shared/device/README.md), run
# from the repo root right after call 1 (`MODELS=vl SIZE=1.5b bash .stage/c1/device_stage1.sh`),
# with this tree in .gpu-src (see RESULTS.md). Usage: run_multi_gpu.sh NAME PHASE [ARGS...]:
# runs benchmarks/gpu/bench_multi_gpu.py PHASE ARGS, its JSON to $OUT/NAME.json and /tmp/NAME.json
# (a later phase reads it there), its output to $OUT/NAME.log, the gateways' and replicas' log
# tails to $OUT/NAME-logs.txt.
set -u -o pipefail
NAME=$1; shift
OUT=${OUT:-/tmp/grm-gpu}; mkdir -p "$OUT"
bash .stage/c2/device_setup.sh || exit 3
export PYTHONPATH=$PWD/.gpu-src:/tmp/vsite PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 GRM_GPU_LOG_DIR=/tmp/grm-multi-$NAME
# NVLink multicast stays off on shared multi-GPU hosts (the device notes), for every child too.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L | tee "$OUT/$NAME-gpus.txt"
timeout -s INT "${GRM_GPU_TIMEOUT:-560}" python3 .gpu-src/benchmarks/gpu/bench_multi_gpu.py "$@" \
  --out "/tmp/$NAME.json" 2>&1 | tee "$OUT/$NAME.log"
rc=$?
cp "/tmp/$NAME.json" "$OUT/" 2>/dev/null
find "$GRM_GPU_LOG_DIR" -name '*.log' -print0 | while IFS= read -r -d '' f; do
  echo "=== $f"; tail -n 60 "$f"; done > "$OUT/$NAME-logs.txt"
exit $rc
