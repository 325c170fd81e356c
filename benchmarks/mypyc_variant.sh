#!/usr/bin/env bash
# A copy of the checkout's grm_service with the request path's modules compiled by mypyc, for
# `bench_gateway.py --variant mypyc=OUT`: does compiling the product's own Python close the gap
# to vllm-router (issue 23, goal 3)? Not a product build: the copy marks two exception classes
# non-native (mypyc cannot compile a subclass of a builtin exception as a native class), and
# leaves out edge/protocol.py, whose classes are subclassed at start-up (`protocol_for`), which
# an interpreted class may not do to a compiled one. Needs gcc and Python's headers; about
# 7.5 minutes on 2 cores, most of it mypy's type check of FastAPI, pydantic and starlette.
#   bash benchmarks/mypyc_variant.sh [OUT_DIR]      (default /tmp/grm-mypyc; prints mypyc=DIR)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
out=${1:-/tmp/grm-mypyc}
rm -rf "$out"
mkdir -p "$out"
(cd "$repo" && git archive HEAD grm_service pyproject.toml) | tar -x -C "$out"
cd "$out"
non_native() {  # FILE CLASS_LINE: the class compiled as a plain Python class
  python3 - "$1" "$2" <<'EOF'
import sys
path, line = sys.argv[1], sys.argv[2]
text = open(path).read()
if line not in text:
    sys.exit(f"{path}: {line!r} not found; update mypyc_variant.sh")
text = text.replace(line, "@mypyc_attr(native_class=False)\n" + line)
text = text.replace("from __future__ import annotations\n",
                    "from __future__ import annotations\nfrom mypy_extensions import mypyc_attr\n", 1)
open(path, "w").write(text)
EOF
}
non_native grm_service/gateway/edge/rules.py "class Unbound(TypeError):"
non_native grm_service/gateway/request/upstream.py \
  "class UpstreamProtocolError(ConnectionError):"
modules=(canonical tally gateway/request/router gateway/request/proxy gateway/request/answer
         gateway/request/upstream gateway/request/checkpoint gateway/edge/replies
         gateway/edge/rules gateway/edge/hotpath gateway/edge/middleware gateway/edge/head
         ledger/book)
files=()
for module in "${modules[@]}"; do files+=("grm_service/$module.py"); done
"$repo/.venv/bin/mypyc" --strict "${files[@]}" >"$out/build.log" 2>&1 \
  || { tail -30 "$out/build.log" >&2; exit 1; }
echo "mypyc=$out"
