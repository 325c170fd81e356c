#!/bin/bash
# The HTTP edge on the bodies trainers send (issue 50's goals), on the device machine's CPUs (no
# GPU used): first the machine pinned to 2 cores (everything, stubs and wrk included, as on a
# 2-core host), the gateway against vllm-router on the judge and the OpenAI SDK bodies; then
# all 16 cores, `serve --workers 1` and `--workers 8` on 4 fast stubs against vllm-router.
#
#   KIT=DIR [PARTS="2c 16c"] [BEFORE=DIR] bash benchmarks/gpu/run_edge.sh
#
# KIT holds whl/ and bin/ as for run_workers.sh. BEFORE: a folder with an earlier grm_service
# package, run in the same rounds as contender "before" (2c) or "grm-service-wN-before" (16c).
# Results go to $OUT.
set -u -o pipefail
OUT=${OUT:-/tmp/grm-edge}; mkdir -p "$OUT"
# shellcheck source=benchmarks/gpu/kit_env.sh
source benchmarks/gpu/kit_env.sh
echo "cores: $(nproc), $(lscpu | sed -n 's/^Model name: *//p')" | tee "$OUT/machine.txt"
PARTS=${PARTS:-2c 16c}
before=() before_workers=()
if [ -n "${BEFORE:-}" ]; then
    before=(--variant "before=$BEFORE") before_workers=(--gateway-workers-src "before=$BEFORE")
fi
part 2c && for body in judge sdk; do
    taskset -c 0,1 bash -c "$(declare -f bench); OUT=$OUT; bench edge-2c-$body 150 \
        --body $body --contenders grm-service vllm-router ${before[*]} --concurrency 64 \
        --rounds 3 --duration 4 --pair-with vllm-router"
done
part 16c && bench edge-16c-judge "${WORKERS_TIMEOUT:-240}" --body judge --contenders vllm-router \
    --gateway-workers 1 8 "${before_workers[@]}" --replicas 4 --fast-stubs --concurrency 64 256 \
    --rounds 2 --duration 4
