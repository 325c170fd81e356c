#!/bin/bash
# Gateway workers at saturation on the device machine's cores (no GPU used), with stubs that
# cost little (bench_gateway.py --fast-stubs), beside the same run on the stub app, so that one
# call shows how much of the curve the stubs' own CPU took:
#  1. the machine's topology (which logical CPUs share a physical core);
#  2. 4 fast stubs, c = 64 and 256, `serve --workers 1/2/4/8` against vllm-router and direct;
#  3. 4 app stubs, c = 64, the same contenders;
#  4. workers below saturation (PARTS="waits"): one fast stub answering after 0.1 s, c = 512
#     against its 256 in-flight bound;
#  5. idle workers' CPU per second (benchmarks/idle_cpu.py);
#  6. where the growth of CPU per request with N comes from (PARTS="gate bisect"): the shared
#     gate alone taken by 1-16 processes at once (bench_shared_gate.py), and 1 and 8 workers,
#     their ledger on and off, beside 8 independent gateways (no shared gate, metrics or ledger);
#  7. this tree against BEFORE (a folder holding an older grm_service), in the same rounds
#     (PARTS="gate-ab curve-ab waits-ab"): the shared gate alone (1 and 4 replicas), the curve
#     at c = 64 with 8 independent gateways beside it, and workers below saturation;
#  8. the curve of this tree alone (PARTS="curve"): 4 fast stubs, c = 64 and 256, 1/2/4/8
#     workers, 8 independent gateways, vllm-router and direct;
#  9. why CPU per request grows with N where nothing is shared (PARTS="perworker busy"): one
#     worker at the concurrency each of N workers sees at c = 64 (8, 16, 32, 64), beside
#     vllm-router at the same; and one worker at c = 8 and 64 while BUSY processes spin on
#     other cores (the load 7 more workers put on the host's clocks and caches), alternated
#     with the same runs on a quiet host, ROUNDS times;
# 10. the curve with each worker on a listening socket of its own (the default) against one
#     socket all workers accept on (PARTS="spread"), each worker's share of the gateway's CPU
#     kept (how evenly the connections spread), c = 64 and 256, with 8 independent gateways
#     and vllm-router; SPREAD_WORKERS and SPREAD_C narrow it where device time is short.
#
#   KIT=DIR [BEFORE=DIR] [PARTS="topology fast app waits idle gate bisect gate-ab curve-ab
#       waits-ab curve perworker busy spread"] [TAG=name] [BUSY=7] [ROUNDS=3]
#       [SPREAD_WORKERS="1 2 4 8"] [SPREAD_C="64 256"] bash benchmarks/gpu/run_scaling.sh
#
# KIT as for run_workers.sh. Results go to $OUT.
set -u -o pipefail
OUT=${OUT:-/tmp/grm-scaling}; mkdir -p "$OUT"
TAG=${TAG:-a}
# shellcheck source=benchmarks/gpu/kit_env.sh
source benchmarks/gpu/kit_env.sh
PARTS=${PARTS:-topology fast app idle}
part topology && { lscpu; lscpu -e; } >"$OUT/topology-$TAG.txt" 2>&1
workers=(--contenders direct vllm-router --gateway-workers 1 2 4 8 --replicas 4 --rounds 3
         --duration 4 --pair-with grm-service-w1)
part fast && bench "scaling-fast-$TAG" 240 "${workers[@]}" --fast-stubs --concurrency 64 256
part app && bench "scaling-app-$TAG" 140 "${workers[@]}" --concurrency 64
part waits && bench "waits-fast-$TAG" 170 --contenders direct --gateway-workers 1 2 4 8 \
    --replicas 1 --fast-stubs --stub-delay 0.1 --concurrency 512 --rounds 3 --duration 4 \
    --pair-with grm-service-w1
part gate && PYTHONPATH=$PWD timeout 120 .venv/bin/python benchmarks/bench_shared_gate.py \
    --rounds 20000 --processes 1 2 4 8 16 2>&1 | tee "$OUT/gate-$TAG.md"
part bisect && bench "scaling-bisect-$TAG" 260 --contenders vllm-router --gateway-workers 1 8 \
    --gateway-workers-env noledger=GRM_LEDGER=false --workers 8 --replicas 4 --fast-stubs \
    --concurrency 64 256 --rounds 3 --duration 4 --pair-with grm-service-w1
if part gate-ab; then
    for replicas in 1 4; do
        for tree in before after; do
            src=$PWD; [ "$tree" = before ] && src=${BEFORE:?}
            echo "$tree:" | tee -a "$OUT/gate-ab-$TAG.md"
            PYTHONPATH=$src timeout 100 .venv/bin/python benchmarks/bench_shared_gate.py \
                --rounds 10000 --repeats 2 --replicas "$replicas" --processes 1 2 4 8 16 2>&1 \
                | tee -a "$OUT/gate-ab-$TAG.md"
        done
    done
fi
part curve-ab && bench "curve-ab-$TAG" 260 --contenders vllm-router --gateway-workers 1 2 4 8 \
    --gateway-workers-src "before=${BEFORE:?}" --workers 8 --replicas 4 --fast-stubs \
    --concurrency 64 --rounds 3 --duration 4 --pair-with grm-service-w1
part waits-ab && bench "waits-ab-$TAG" 220 --contenders direct --gateway-workers 1 2 4 8 \
    --gateway-workers-src "before=${BEFORE:?}" --replicas 1 --fast-stubs --stub-delay 0.1 \
    --concurrency 512 --rounds 3 --duration 4 --pair-with grm-service-w1
part idle && timeout 100 .venv/bin/python benchmarks/idle_cpu.py --seconds 8 2>&1 | tail -12 \
    | tee "$OUT/idle-$TAG.md"
part curve && bench "curve-$TAG" 330 --contenders direct vllm-router --gateway-workers 1 2 4 8 \
    --workers 8 --replicas 4 --fast-stubs --concurrency 64 256 --rounds 3 --duration 4 \
    --pair-with grm-service-w1
part perworker && bench "perworker-$TAG" 200 --contenders vllm-router --gateway-workers 1 \
    --replicas 4 --fast-stubs --concurrency 8 16 32 64 --rounds 3 --duration 4 \
    --pair-with vllm-router
if part busy; then
    for round in $(seq "${ROUNDS:-3}"); do
        for host in quiet busy; do
            spinners=()
            if [ "$host" = busy ]; then
                for _ in $(seq "${BUSY:-7}"); do
                    python3 -c 'while True: pass' & spinners+=($!)
                done
            fi
            bench "busy-$TAG-$host-$round" 60 --contenders --gateway-workers 1 --replicas 4 \
                --fast-stubs --concurrency 8 64 --rounds 1 --duration 4
            [ ${#spinners[@]} -gt 0 ] && kill "${spinners[@]}" && wait "${spinners[@]}" 2>/dev/null
        done
    done
fi
# shellcheck disable=SC2086  # the two lists are word-split on purpose
part spread && bench "spread-$TAG" 420 --contenders vllm-router \
    --gateway-workers ${SPREAD_WORKERS:-1 2 4 8} \
    --gateway-workers-env shared=GRM_WORKER_SOCKETS=shared --workers 8 --replicas 4 \
    --fast-stubs --concurrency ${SPREAD_C:-64 256} --rounds 3 --duration 4 \
    --pair-with grm-service-w1
