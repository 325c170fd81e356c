#!/bin/bash
# The gateway's CPU side on the device machine's 16 cores (no GPU used): `serve --workers N` on
# stub replicas against vllm-router (goal: req/s that scale with N at a flat CPU per request),
# then the in-process CPU per request of the OCR (distinct images, 128 tokens with logprobs),
# judge and chat workloads, this tree against BEFORE (a folder holding an older grm_service).
#
#   KIT=DIR BEFORE=DIR bash benchmarks/gpu/run_workers.sh
#
# KIT holds whl/ (the project's dependencies and vllm-router as wheels for the machine's Python:
# it has no package index) and bin/ (wrk and its libluajit). Results go to $OUT.
set -u -o pipefail
OUT=${OUT:-/tmp/grm-workers}; mkdir -p "$OUT"
# shellcheck source=benchmarks/gpu/kit_env.sh
source benchmarks/gpu/kit_env.sh
echo "cores: $(nproc), $(lscpu | sed -n 's/^Model name: *//p')" | tee "$OUT/machine.txt"
timeout "${WORKERS_TIMEOUT:-330}" .venv/bin/python benchmarks/bench_gateway.py \
    --contenders direct vllm-router --gateway-workers ${WORKERS_N:-1 2 4 8} --replicas 4 \
    --concurrency 64 256 --rounds 3 --duration 4 --out workers-16c 2>&1 | tail -60 \
    | tee "$OUT/workers.txt"
cp benchmarks/results/workers-16c.json benchmarks/results/workers-16c.md "$OUT/" 2>/dev/null
for workload in ocr judge chat; do
    for tree in before after; do
        src=$PWD; [ "$tree" = before ] && src=${BEFORE:?}
        line=$(PYTHONPATH=$src timeout 120 .venv/bin/python benchmarks/cpu_inprocess.py \
            --workload "$workload" --requests 2000 --bursts 5 2>&1 | tail -1)
        echo "$workload $tree: $line" | tee -a "$OUT/inprocess.txt"
    done
done
