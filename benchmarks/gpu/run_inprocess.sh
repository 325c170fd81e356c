#!/bin/bash
# The gateway's CPU per request in process (`cpu_inprocess.py`: the real protocol, app and
# proxy, the replica hop in memory) on the device machine's cores, no GPU used: the OCR
# (distinct images, 128 tokens with logprobs), judge and chat workloads, this tree against
# BEFORE (a folder holding an older grm_service), the two alternated in each of ROUNDS rounds.
# A quieter machine than the 2-core one for a before/after of a few percent.
#
#   WHL=DIR BEFORE=DIR OUT=DIR [ROUNDS=3] bash benchmarks/gpu/run_inprocess.sh
#
# WHL holds the project's dependencies as wheels for the machine's Python (it has no package
# index; numpy and Pillow are the image's own).
set -u -o pipefail
[ -e .venv/pyvenv.cfg ] && { echo "a venv is here: this script is for the device machine"; exit 2; }
OUT=${OUT:-/tmp/grm-inprocess}; mkdir -p "$OUT"
SITE=/tmp/grm-inprocess-site
mapfile -t wheels < <(ls "${WHL:?}"/*.whl | grep -v '/grm_service-')
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${wheels[@]}" \
    || exit 3
# The harness starts its stubs with `.venv/bin/python`: here a launcher for the machine's Python
# with that folder added (as kit_env.sh makes it).
rm -rf .venv && mkdir -p .venv/bin
printf '#!/bin/sh\nPYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}%s" exec python3 "$@"\n' "$SITE" \
    >.venv/bin/python
chmod +x .venv/bin/python
echo "cores: $(nproc), $(lscpu | sed -n 's/^Model name: *//p')" | tee "$OUT/machine.txt"
for round in $(seq "${ROUNDS:-3}"); do
    for workload in ocr judge chat; do
        for tree in before after; do
            src=$PWD; [ "$tree" = before ] && src=${BEFORE:?}
            line=$(PYTHONPATH=$src:$SITE timeout 120 .venv/bin/python benchmarks/cpu_inprocess.py \
                --workload "$workload" --requests 2000 --bursts 5 2>&1 | tail -1)
            echo "round $round $workload $tree: $line" | tee -a "$OUT/inprocess.txt"
        done
    done
done
