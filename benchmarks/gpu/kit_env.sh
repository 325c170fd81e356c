# shellcheck shell=bash
# Sourced by the device machine's CPU benchmarks (run_workers.sh, run_ledger_waits.sh): the
# project's dependencies from KIT/whl installed for the machine's own Python (it has no package
# index), `.venv/bin/python` a launcher for it, vllm-router and wrk (KIT/bin) on the PATH; and
# the scripts' two helpers, `bench` (one bench_gateway run kept in $OUT) and `part` (is a part
# named in $PARTS).
KIT=${KIT:?the folder with whl/ and bin/}
# The machine's own Python (it has numpy) with the wheels in a folder of their own; the harness
# runs `.venv/bin/python`, here a launcher that adds that folder to whatever PYTHONPATH it gets.
SITE=/tmp/grm-bench-site
python3 -m pip install -q --no-index --no-compile --target "$SITE" --find-links "$KIT/whl" \
    fastapi 'uvicorn[standard]' httpx httptools pydantic pydantic-settings prometheus-client \
    typer rich blake3 rapidfuzz pybase64 google-re2 pyyaml msgspec psutil pillow isal \
    vllm-router || exit 3
rm -rf .venv  # a venv's python is a link to the interpreter: never write through it
mkdir -p .venv/bin
printf '#!/bin/sh\nPYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}%s" exec python3 "$@"\n' "$SITE" \
    >.venv/bin/python
chmod +x .venv/bin/python
.venv/bin/python -c 'import numpy, PIL, fastapi, uvloop, msgspec' || exit 4
mkdir -p benchmarks/.venv-peers/bin
ln -sf "$SITE/bin/vllm-router" benchmarks/.venv-peers/bin/vllm-router
# py-spy where the kit carries it (profile_gateway.py): a wheel of its own binary, in a folder
# of its own (pip --target leaves a bin/ that exists as it was, without the new binary).
for wheel in "$KIT"/whl/py_spy-*.whl; do
    [ -e "$wheel" ] || continue
    python3 -m pip install -q --no-index --no-deps --target "$SITE-spy" "$wheel" \
        && ln -sf "$SITE-spy/bin/py-spy" benchmarks/.venv-peers/bin/py-spy
done
export PATH="$KIT/bin:$PATH" LD_LIBRARY_PATH="$KIT/bin" PYTHONUNBUFFERED=1

bench() {  # NAME TIMEOUT ARGS...: one bench_gateway run, its tables and raw runs kept in $OUT
    local name=$1 limit=$2
    shift 2
    timeout "$limit" .venv/bin/python benchmarks/bench_gateway.py "$@" --out "$name" 2>&1 \
        | tail -30 | tee "$OUT/$name.txt"
    cp "benchmarks/results/$name.json" "benchmarks/results/$name.md" "$OUT/" 2>/dev/null
}
part() { [[ " $PARTS " == *" $1 "* ]]; }
