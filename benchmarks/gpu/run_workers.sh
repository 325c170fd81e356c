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
KIT=${KIT:?the folder with whl/ and bin/}
# The machine's own Python (it has numpy) with the wheels in a folder of their own; the harness
# runs `.venv/bin/python`, here a launcher that adds that folder to whatever PYTHONPATH it gets.
SITE=/tmp/grm-bench-site
python3 -m pip install -q --no-index --no-compile --target "$SITE" --find-links "$KIT/whl" \
    fastapi 'uvicorn[standard]' httpx httptools pydantic pydantic-settings prometheus-client \
    typer rich blake3 rapidfuzz pybase64 google-re2 pyyaml msgspec psutil pillow vllm-router || exit 3
rm -rf .venv  # a venv's python is a link to the interpreter: never write through it
mkdir -p .venv/bin
printf '#!/bin/sh\nPYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}%s" exec python3 "$@"\n' "$SITE" \
    >.venv/bin/python
chmod +x .venv/bin/python
.venv/bin/python -c 'import numpy, PIL, fastapi, uvloop, msgspec' || exit 4
mkdir -p benchmarks/.venv-peers/bin
ln -sf "$SITE/bin/vllm-router" benchmarks/.venv-peers/bin/vllm-router
export PATH="$KIT/bin:$PATH" LD_LIBRARY_PATH="$KIT/bin" PYTHONUNBUFFERED=1
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
