#!/bin/bash
# The gateway's CPU side on the device machine's 16 cores (no GPU used), one call, three parts:
#  1. what recording every answer costs where the writer thread has a core of its own: one
#     gateway, its ledger on, off (GRM_LEDGER=false) and BEFORE's, stubs, c = 64, paired rounds;
#  2. workers below saturation: one stub replica answering after 0.1 s, c = 512 against the
#     replica's 256 in-flight bound (half the requests wait in its gate), 1/2/4/8 workers:
#     CPU per request should not grow with N (waits park on an event, not a poll);
#  3. workers at saturation: 4 stub replicas, c = 64, 1/2/4/8 workers against vllm-router;
#  4. what 1/2/4/8 idle workers cost per second (benchmarks/idle_cpu.py).
#
#   KIT=DIR BEFORE=DIR [PARTS="ledger waits workers idle"] bash benchmarks/gpu/run_ledger_waits.sh
#
# KIT as for run_workers.sh; BEFORE a folder holding an older grm_service; PARTS the parts to
# run (all by default). Results go to $OUT.
set -u -o pipefail
OUT=${OUT:-/tmp/grm-ledger-waits}; mkdir -p "$OUT"
# shellcheck source=benchmarks/gpu/kit_env.sh
source benchmarks/gpu/kit_env.sh
echo "cores: $(nproc), $(lscpu | sed -n 's/^Model name: *//p')" | tee "$OUT/machine.txt"
PARTS=${PARTS:-ledger waits workers idle}
part ledger && bench ledger-cost-16c 200 --contenders grm-service grm-service-noledger \
    --variant "before=${BEFORE:?}" --concurrency 64 --rounds 5 --duration 4 \
    --pair-with grm-service-noledger
part waits && for tree in before after; do  # the same bench on each tree, one after the other
    src=(); [ "$tree" = before ] && src=(--workers-src "$BEFORE")
    bench "waits-16c-$tree" 200 --contenders direct --gateway-workers 1 2 4 8 --replicas 1 \
        --stub-delay 0.1 --concurrency 512 --rounds 3 --duration 4 --pair-with grm-service-w1 \
        "${src[@]}"
done
part workers && bench workers-16c-s 180 --contenders direct vllm-router --gateway-workers 1 2 4 8 \
    --replicas 4 --concurrency 64 --rounds 3 --duration 4 --pair-with grm-service-w1
part idle && timeout 120 .venv/bin/python benchmarks/idle_cpu.py --seconds 10 2>&1 | tail -12 \
    | tee "$OUT/idle-16c.md"
